"""The backend kit: what every scheduler needs and none of them owns.

A backend is "fill in a snapshot, a lookup, a state table and a request builder"; the rest lives here::

    watcher.py   StatusWatcher: one batched snapshot per tick for every watched app, single-flight,
                 ended apps cached for good
    polling.py   poll_until_terminal: wait() for backends without an event, back-off in its docstring;
                 poll_until: any other wait with no event (a pod's IP, a container to start)
    logs.py      replica/stream checks (log_iter's prologue), follow(read_new, ended), regex/time
                 filtering, line splitting, UTF-8-safe re-chunking
    status.py    StateTable (backend state names -> AppState), failure attribution to one replica,
                 aggregate_roles: per-replica observations -> roles and the app's state
    record.py    AppRecord: the submitted AppDef and details kept for describe() when the backend forgets;
                 final.json (the last status), describe's answer with the record attached
    errors.py    run a CLI with timeout/missing-binary errors; map a backend's errors onto tsm's tree;
                 ClientBase (call counting, one error translation) and ApiError (keeps the HTTP status)
    appdir.py    AppDir: every file a container backend keeps of an app, private (0600/0700 whatever the
                 umask or $TSM_HOME's mode) and written atomically (request, record, final status, logs)
    controller.py  the container controller as a pure decision: RoleShape, decide() -> Retry | Finish |
                 None (ROLE/APPLICATION retries, final failure, gang timeout); backends observe and act
    owner.py     the owner label value every container-backend object carries and every list selects
    failure.py   structured_error_msg specified once: structured_error, failure_of, parse_structured_error
    factory.py   the factory rule: scheduler_params(backend, kwargs, accepted) -> UnknownSchedulerParamError
    viewmodel.py AppSummary/ReplicaSummary (what a BatchedViews hook returns), view_of_describe, LastLines
    options.py   RunOptions: a backend's run options declared once as a dataclass
    files.py     private directories and files, quiet unlink/rmdir
    quoting.py   shell quoting that survives sbatch and any bash script
    optional.py  import a client library or raise SchedulerUnavailableError naming the extra

Nothing here imports a client library or another backend; this package's ``__init__`` imports nothing, so
a backend pays only for the modules it uses.
"""
