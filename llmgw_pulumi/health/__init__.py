"""Is a GPU node ready: what it prints about its GPUs, driver and fabric, parsed, and the verdict (pure)."""
