"""The library's core: the batch (Rollouts, Credit), configs and their errors, segmentation, counted model access
(Probe), the loss, group statistics and value probes, the one Registry, and pickle-free files on disk."""
