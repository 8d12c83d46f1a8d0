"""One backend over N processes: the base model's decoder layers sharded with FSDP2, the leader's engine calls made
on every process in the same order."""
