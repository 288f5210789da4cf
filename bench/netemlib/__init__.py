"""The parts of ``bench/netem.py`` (the emulated-network benchmark), one purpose each:

* :mod:`.common`: constants, the exceptions that end a run early, ``say`` and ``tail``, and
  the units (delay, rate and size arguments; how sizes and times are printed);
* :mod:`.cli`: the command line (parser, checks, the sweep plan);
* :mod:`.capabilities`: what this machine allows, found by trying it in a throwaway namespace;
* :mod:`.netns`: namespaces, veths, the bridge, the qdiscs, and their deletion;
* :mod:`.cluster`: the processes a run starts (stopped by PID), and the netcoll coordinator
  and rank daemons they form inside the namespaces;
* :mod:`.sweep`: the calibrations and the sweeps (``python3 -m netcoll.bench``);
* :mod:`.model`: the cost formulas, the ``auto`` choice and the crossover finder (pure), and
  the predictions and crossovers for a run's measurements;
* :mod:`.report`: the text table, the plot and the JSON;
* :mod:`.run`: one run's state and its phases, with the cleanup under signals.

Nothing here imports netcoll at module level: the "not allowed here" path needs nothing but
Python.
"""
