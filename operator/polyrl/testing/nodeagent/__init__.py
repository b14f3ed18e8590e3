"""A node agent of our own: the kubelet's part for nodes without a container runtime.

This is the one fake in the test infrastructure, and it is named as such: there is no
container runtime and no image here. Everything else (API server, scheduler, controllers)
is real. The agent

- registers Nodes and keeps them Ready, renewing their Leases in `kube-node-lease` so the
  node lifecycle controller never marks them NotReady and evicts their pods;
- gives every pod an address of its own (`podnet`) and reports it as `status.podIP`;
- sees the pods the scheduler binds to its nodes and, by mode,
  - `status`: marks them Running and Ready and runs nothing (control-plane tests), or
  - `exec`: runs each container's command and args as a local process (`runner`), in a
    mount namespace of its own with the pod's volumes mounted (`container`, `volumes`:
    the service-account token, emptyDir, ConfigMap, Secret, downward API, projected,
    PersistentVolumeClaim and hostPath volumes), the pod's env (fieldRef, secretKeyRef,
    configMapKeyRef, envFrom and `$(VAR)` expansion resolved, `podenv`) over the in-cluster
    variables, its hostname and /etc/hosts, and its probes (`probes`); exits become
    container states, termination messages and the pod's phase (Succeeded/Failed under
    `restartPolicy: Never`, restarts with backoff otherwise);
- serves container logs the way a kubelet does, for `kubectl logs` (`kubeletapi`);
- completes graceful deletions: SIGTERM to the pod's processes, SIGKILL after the grace
  period, then the final delete with grace 0, as a kubelet does;
- runs the test storage provisioner (`polyrl.testing.provisioner`).

The mode is set per agent (`--mode`, default `status`) and overridden per namespace with
the label `agent.polyrl.dev/mode: exec|status`, so one session can hold both kinds of tests.
What stays fake is listed in the README ("The node agent").
"""
