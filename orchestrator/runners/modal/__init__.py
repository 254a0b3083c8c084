"""Experiments and whole nights on Modal: the `modal` runner and what both sides of it share.

- runner.py: ModalRunner, the daemon's runner (train and evaluate in containers; verify and bench
  stay local), and the compute bill;
- calls.py: the watch over each spawned call (a call that never starts or is lost is spawned again);
- functions.py: the Modal objects (image, app `autorl`, volume, functions); the only module that
  imports modal at module level;
- experiment.py, night.py, doctor.py: the plain-Python work those functions do in a container;
- support.py: names, the volume's layout and the credential checks the daemon makes without modal;
- pull.py: `python -m orchestrator pull`, a run made on Modal brought home.

modal_app.py, at the repository's root, is the thin entry for `modal run`.
"""
