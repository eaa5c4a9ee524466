"""Engine replicas past one machine: session affinity with the policy's placement
(``affinity``, without Ray), as a Ray Serve request router (``ray_router``) over twin
replicas (``ray_serve``); docs/ray-serve.md."""
