"""The robustness harnesses: whole clusters of netcoll processes on loopback under hostile
conditions, each a module with a command line for long runs and a coroutine the slow tests
(``tests/integration/test_{chaos,soak,fuzz_live}.py``) run at a CI size.

:mod:`.chaos` (jobs while rank daemons are SIGKILLed and SIGSTOPped), :mod:`.soak` (many
jobs; RSS and descriptors must stay flat), :mod:`.fuzz_live` (malformed frames and RPC
bodies before and after authentication; the input itself comes from :mod:`.malformed`),
and :mod:`.cluster` (the coordinator and rank daemons they run against).
``docs/reliability.md`` describes what they check.
"""
