"""Exact data order on resume: resumable samplers, loaders and per-sample seeding."""
