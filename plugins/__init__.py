"""The built-in idrs-bench plugins, registered through the same hooks as third-party ones."""
