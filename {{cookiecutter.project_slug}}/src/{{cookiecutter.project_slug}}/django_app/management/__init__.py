"""Django's management commands of the kit's app."""
