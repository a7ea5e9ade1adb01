"""Shared test utilities: throwaway servers, a sync RESP client, key clean-up, a fault proxy.

Import as ``from helpers.<module> import ...`` (pytest puts ``tests/`` on ``sys.path`` because
``tests/conftest.py`` lives there).
"""
