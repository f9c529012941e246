"""Sampling: images from a model (grids, .npz files for FID, per-sample seeds, guidance). Imports the
models, the transport, the Hub model files and the shared plumbing; nothing above it."""
