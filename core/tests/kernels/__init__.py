"""The reference kernels' tests (a package, so that test module names may repeat elsewhere)."""
