"""Many devices and hosts.

  sharding.py     the ('data', 'fsdp') mesh; batch, replicated and FSDP shardings
  distributed.py  multi-host: jax.distributed from config, host copies of arrays
The training loop builds the mesh from config.mesh; the commands run on one device.
"""
