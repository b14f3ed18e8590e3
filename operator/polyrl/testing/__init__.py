"""Real services for tests and local development: a Kubernetes control plane and a node agent.

Nothing here is a mock. `tools` builds kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, etcd and helm from their Go modules; `controlplane` runs them on
loopback with generated certificates and RBAC; `nodeagent` plays the kubelet's part for
nodes that have no container runtime (the one fake, named as such). The nats-server and the
process supervision they build on are the local runner's (`polyrl.local`): test support uses
the product's parts, never the reverse.
"""
