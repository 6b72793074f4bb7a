"""Implementation of ``scripts/fake_services.py`` (see its docstring for the API)."""
