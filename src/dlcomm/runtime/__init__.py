"""The ground floor of every job that starts processes (docs/ARCHITECTURE.md, "Runtime").

- :mod:`.env`: the env:// facts a worker reads (WorkerEnv) and its process group's lifetime;
- :mod:`.processes`: start a child that dies with its parent, stop it TERM-then-KILL;
- :mod:`.failures`: a worker's one-line failure report, written once, read by the launcher;
- :mod:`.jobdir`: job directories under $TMPDIR, and those of dead launchers collected;
- :mod:`.rendezvous`: the job's TCPStore, hosted by the launcher (no free-port race);
- :mod:`.placement`: where rank i runs (command prefix, environment, network namespace);
- :mod:`.launcher`: N ranks of a job, watched, with the root cause of a failure named.
"""
