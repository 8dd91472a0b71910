"""Helpers of tests/test_real_path.py: the pieces of a GPU node the test plays itself (the
InfiniBand sysfs tree), the processes it starts, and what it reads back from Slurm."""
