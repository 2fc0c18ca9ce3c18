"""submitit's `core` package path, kept so programs and plugins importing it find it."""
