"""GPU check, sanitizer case and profiler drivers: run as `python -m scripts.NAME`."""
