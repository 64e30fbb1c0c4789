"""statekeeper inside training frameworks: each module is imported only when used, and
needs its framework installed (``pip install 'statekeeper[accelerate]'``, ...)."""
