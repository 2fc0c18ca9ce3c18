"""The backend kit: what every scheduler needs and none of them owns.

A backend is "fill in a snapshot, a lookup, a state table and a request builder"; the rest lives here::

    watcher.py   StatusWatcher: one batched snapshot per tick for every watched app, single-flight,
                 ended apps cached for good
    polling.py   poll_until_terminal: wait() for backends without an event, back-off in its docstring
    logs.py      replica/stream checks (log_iter's prologue), follow(read_new, ended), regex/time
                 filtering, line splitting, UTF-8-safe re-chunking
    status.py    StateTable (backend state names -> AppState), failure attribution to one replica,
                 aggregate_roles: per-replica observations -> roles and the app's state
    record.py    AppRecord: the submitted AppDef and details kept for describe() when the backend forgets;
                 final.json (the last status), describe's answer with the record attached
    errors.py    run a CLI with timeout/missing-binary errors; map a backend's errors onto tsm's tree
    options.py   RunOptions: a backend's run options declared once as a dataclass
    files.py     private directories and files, quiet unlink/rmdir
    quoting.py   shell quoting that survives sbatch and any bash script
    optional.py  import a client library or raise SchedulerUnavailableError naming the extra

Nothing here imports a client library or another backend; this package's ``__init__`` imports nothing, so
a backend pays only for the modules it uses.
"""
