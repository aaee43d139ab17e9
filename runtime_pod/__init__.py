"""runtime_pod: the per-instance runtime process (step admission, instance settings)."""
