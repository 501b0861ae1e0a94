"""What runs inside the job: the bootstrap, the per-process Session, ring buffers, doctor.step()."""
