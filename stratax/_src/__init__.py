"""Internals of stratax: nothing here is public API (see ``stratax/__init__.py``)."""
