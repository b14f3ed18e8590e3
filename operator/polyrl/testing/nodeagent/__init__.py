"""A node agent of our own: the kubelet's part for nodes without a container runtime.

This is the one fake in the test infrastructure, and it is named as such: there is no
container runtime and no image here. Everything else (API server, scheduler, controllers)
is real. The agent

- registers Nodes and keeps them Ready, renewing their Leases in `kube-node-lease` so the
  node lifecycle controller never marks them NotReady and evicts their pods;
- sees the pods the scheduler binds to its nodes and, by mode,
  - `status`: marks them Running and Ready and runs nothing (control-plane tests), or
  - `exec`: runs each container's command and args as a local process with the pod's env
    (fieldRef, secretKeyRef, configMapKeyRef, envFrom and `$(VAR)` expansion resolved), in a
    per-pod sandbox directory, and reports exits as container states and the pod's phase
    (Succeeded/Failed under `restartPolicy: Never`, restarts with backoff otherwise);
- completes graceful deletions: SIGTERM to the pod's processes, SIGKILL after the grace
  period, then the final delete with grace 0, as a kubelet does.

The mode is set per agent (`--mode`) and can be overridden per namespace with the label
`agent.polyrl.dev/mode: exec|status`, so one session can hold both kinds of tests.
Processes inherit the agent's environment (PATH, virtualenv) beneath the pod's env; the
image is ignored, and volumes are not mounted.
"""
