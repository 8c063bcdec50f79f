"""What every pipeline shares: the device and progress output (`device`), all-or-nothing run
directories and atomic writes (`rundir`), and the allocator settings (`allocator`)."""
