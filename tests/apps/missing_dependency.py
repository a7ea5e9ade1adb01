"""An app module that imports a package that is not installed (for the CLI's start-up error)."""

import not_an_installed_package_xyz  # noqa: F401
