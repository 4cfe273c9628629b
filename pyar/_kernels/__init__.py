"""Code objects compiled from src/kernels at build time, and their loading."""
