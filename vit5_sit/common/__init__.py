"""Shared plumbing: argument and path checks, clean interrupts, small utilities, the distributed helper,
class names. Imports nothing of vit5_sit but itself (the bottom of the package)."""
