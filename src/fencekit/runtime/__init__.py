"""How the components are assembled and configured: settings, the shared services, ``Server``, ``App``."""
