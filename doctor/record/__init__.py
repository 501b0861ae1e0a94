"""What runs inside the job: the per-process Session, ring buffers, doctor.step() (doctor.bootstrap
starts a Session and its probes)."""
