"""C kernels for the CPU paths torch serves slowly (see build.py)."""
