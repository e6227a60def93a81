"""Stage control: the controller around the core scheduler, failover recovery, reruns, gc and the read model."""
