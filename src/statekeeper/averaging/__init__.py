"""Averaged models: online EMA/SWA (``averaged_model``) and offline checkpoint averaging
(``offline``)."""
