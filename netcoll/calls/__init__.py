"""Per-collective plans: argument checks and the algorithm call, one module
per family (:mod:`.reducing`, :mod:`.moving`, :mod:`.p2p`). Part of the comm
layer: :class:`netcoll.comm.Communicator` issues what they return."""
