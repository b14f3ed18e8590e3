#!/usr/bin/env bash
# Builds the real Kubernetes control plane, etcd and helm from their Go modules.
#
# Why from Go modules: our machines have Go and the Go module proxy but no Docker and
# no release downloads, so kind/k3d and prebuilt binaries are out. Each tool is built
# in a throw-away wrapper module (k8s.io/kubernetes only builds as a dependency when
# every staging module `k8s.io/X` is replaced by its published `v0.N.x`).
#
# Cache layout (outside the clone, keyed by version):
#   $POLYRL_TOOLS_DIR/kubernetes-<ver>/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   $POLYRL_TOOLS_DIR/etcd-<ver>/{etcd,etcdctl}
#   $POLYRL_TOOLS_DIR/helm-<ver>/helm
#   $POLYRL_TOOLS_DIR/kueue-<ver>/{kueue,crd/,webhook/}  (the CRDs and webhooks as Kueue ships them)
# A directory counts only when it holds a `.complete` stamp, written after every binary
# was built into a temporary sibling and the sibling renamed into place; a half-built
# cache is therefore never mistaken for a good one.
#
# Usage: build-tools.sh [kubernetes|etcd|helm|kueue|all]   (default: all)
set -euo pipefail

# Versions and the cache directory come from polyrl.testing.tools (the one place they are
# pinned); run this through `python -m polyrl.testing.tools build` or `make tools`.
K8S_VERSION="${POLYRL_K8S_VERSION:?set by polyrl.testing.tools}"
ETCD_VERSION="${POLYRL_ETCD_VERSION:?set by polyrl.testing.tools}"
HELM_VERSION="${POLYRL_HELM_VERSION:?set by polyrl.testing.tools}"
KUEUE_VERSION="${POLYRL_KUEUE_VERSION:?set by polyrl.testing.tools}"
TOOLS="${POLYRL_TOOLS_DIR:?set by polyrl.testing.tools}"
LOGS="${POLYRL_LOGS_DIR:?set by polyrl.testing.tools}"
mkdir -p "$TOOLS" "$LOGS"

# Work trees and unfinished output dirs are removed however the script ends.
CLEANUP=()
cleanup() { for d in "${CLEANUP[@]}"; do [[ -n "$d" ]] && rm -rf "$d"; done; }
trap cleanup EXIT

STAGING=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
  cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
  kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
  mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming)

die() {  # step, log
  echo "build-tools: FAILED at step '$1'; see log: $2" >&2
  [[ -f "$2" ]] && tail -n 20 "$2" | sed 's/^/    /' >&2
  exit 1
}

require_go() {
  command -v go >/dev/null 2>&1 || {
    echo "build-tools: FAILED at step 'find Go toolchain': 'go' is not on PATH (Go >= 1.26 is needed to build the control plane)" >&2
    exit 1
  }
}

finish() {  # tmpdir final
  touch "$1/.complete"
  rm -rf "$2"
  mv "$1" "$2"
}

build_kubernetes() {
  local final="$TOOLS/kubernetes-$K8S_VERSION" log="$LOGS/build-kubernetes-$K8S_VERSION.log"
  [[ -f "$final/.complete" ]] && { echo "kubernetes $K8S_VERSION: cached in $final"; return; }
  local minor="v0.${K8S_VERSION#v1.}"
  local work tmp; work="$(mktemp -d)"; tmp="$(mktemp -d "$TOOLS/.kubernetes-$K8S_VERSION.XXXX")"
  CLEANUP+=("$work" "$tmp")
  echo "kubernetes $K8S_VERSION: building (staging modules at $minor; log $log)"
  {
    echo "module polyrl.dev/k8s-build"; echo; echo "go 1.26.0"; echo
    echo "require k8s.io/kubernetes $K8S_VERSION"; echo
    echo "replace ("
    for m in "${STAGING[@]}"; do echo "	k8s.io/$m => k8s.io/$m $minor"; done
    echo ")"
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  ( cd "$work" && go mod tidy ) >"$log" 2>&1 || die "kubernetes: resolve modules (go mod tidy)" "$log"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    echo "  building $cmd"
    ( cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w \
        -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
        -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
        -X k8s.io/component-base/version.gitMajor=1 \
        -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#v1.} " \
        -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd" ) >>"$log" 2>&1 || die "kubernetes: go build $cmd" "$log"
  done
  finish "$tmp" "$final"
  echo "kubernetes $K8S_VERSION: built into $final"
}

build_etcd() {
  local final="$TOOLS/etcd-$ETCD_VERSION" log="$LOGS/build-etcd-$ETCD_VERSION.log"
  [[ -f "$final/.complete" ]] && { echo "etcd $ETCD_VERSION: cached in $final"; return; }
  local work tmp; work="$(mktemp -d)"; tmp="$(mktemp -d "$TOOLS/.etcd-$ETCD_VERSION.XXXX")"
  CLEANUP+=("$work" "$tmp")
  echo "etcd $ETCD_VERSION: building (log $log)"
  cat > "$work/go.mod" <<GOMOD
module polyrl.dev/etcd-build

go 1.26.0

require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/etcdctl/v3 $ETCD_VERSION
)
GOMOD
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
GO
  ( cd "$work" && go mod tidy ) >"$log" 2>&1 || die "etcd: resolve modules (go mod tidy)" "$log"
  ( cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 ) \
    >>"$log" 2>&1 || die "etcd: go build etcd" "$log"
  ( cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3 ) \
    >>"$log" 2>&1 || die "etcd: go build etcdctl" "$log"
  finish "$tmp" "$final"
  echo "etcd $ETCD_VERSION: built into $final"
}

build_helm() {
  local final="$TOOLS/helm-$HELM_VERSION" log="$LOGS/build-helm-$HELM_VERSION.log"
  [[ -f "$final/.complete" ]] && { echo "helm $HELM_VERSION: cached in $final"; return; }
  local work tmp; work="$(mktemp -d)"; tmp="$(mktemp -d "$TOOLS/.helm-$HELM_VERSION.XXXX")"
  CLEANUP+=("$work" "$tmp")
  echo "helm $HELM_VERSION: building (log $log)"
  cat > "$work/go.mod" <<GOMOD
module polyrl.dev/helm-build

go 1.26.0

require helm.sh/helm/v3 $HELM_VERSION
GOMOD
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  ( cd "$work" && go mod tidy ) >"$log" 2>&1 || die "helm: resolve modules (go mod tidy)" "$log"
  ( cd "$work" && CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      -o "$tmp/helm" helm.sh/helm/v3/cmd/helm ) >>"$log" 2>&1 || die "helm: go build helm" "$log"
  finish "$tmp" "$final"
  echo "helm $HELM_VERSION: built into $final"
}

# Kueue's controller and its CRDs. Its go.mod has no replace directives, so it builds as a
# plain dependency; the CRDs and webhook manifests come from the same module version.
# One change to Kueue: with internal certificate management off, cmd/kueue reads its metrics
# certificate from /etc/kueue/metrics/certs, a path only an in-cluster install provides. Its
# main package (which imports no internal package) is copied into the wrapper module with
# that directory read from $KUEUE_METRICS_CERT_DIR, falling back to the same path; every
# other package is Kueue's module as published.
kueue_main() {  # module-dir work-dir
  local main="$1/cmd/kueue/main.go" out="$2/cmd/kueue"
  local from='metricsCertPath := "/etc/kueue/metrics/certs"'
  [[ "$(grep -cF "$from" "$main")" == 1 ]] || { echo "cmd/kueue/main.go no longer holds: $from"; return 1; }
  mkdir -p "$out"
  sed "s#$from#metricsCertPath := metricsCertDir()#" "$main" > "$out/main.go"
  cat > "$out/polyrl_metrics_certs.go" <<'GO'
package main

import "os"

// metricsCertDir is polyrl's one change: where the metrics certificate lives.
func metricsCertDir() string {
	if dir := os.Getenv("KUEUE_METRICS_CERT_DIR"); dir != "" {
		return dir
	}
	return "/etc/kueue/metrics/certs"
}
GO
}

# Kueue's controller and its CRDs. Its go.mod has no replace directives, so it builds as a
# plain dependency; the CRDs and webhook manifests come from the same module version.
build_kueue() {
  local final="$TOOLS/kueue-$KUEUE_VERSION" log="$LOGS/build-kueue-$KUEUE_VERSION.log"
  [[ -f "$final/.complete" ]] && { echo "kueue $KUEUE_VERSION: cached in $final"; return; }
  local work tmp; work="$(mktemp -d)"; tmp="$(mktemp -d "$TOOLS/.kueue-$KUEUE_VERSION.XXXX")"
  CLEANUP+=("$work" "$tmp")
  echo "kueue $KUEUE_VERSION: building (log $log)"
  cat > "$work/go.mod" <<GOMOD
module polyrl.dev/kueue-build

go 1.26.0

require sigs.k8s.io/kueue $KUEUE_VERSION
GOMOD
  ( cd "$work" && go mod download sigs.k8s.io/kueue ) >"$log" 2>&1 || die "kueue: download the module" "$log"
  local src; src="$(cd "$work" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  kueue_main "$src" "$work" >>"$log" 2>&1 || die "kueue: copy its main package" "$log"
  ( cd "$work" && go mod tidy ) >>"$log" 2>&1 || die "kueue: resolve modules (go mod tidy)" "$log"
  ( cd "$work" && CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$tmp/kueue" ./cmd/kueue ) >>"$log" 2>&1 || die "kueue: go build kueue" "$log"
  cp -r "$src"/config/components/crd "$tmp/crd"
  cp -r "$src"/config/components/webhook "$tmp/webhook"
  chmod -R u+w "$tmp"
  finish "$tmp" "$final"
  echo "kueue $KUEUE_VERSION: built into $final"
}

main() {
  require_go
  local what="${1:-all}" t0=$SECONDS
  case "$what" in
    kubernetes) build_kubernetes ;;
    etcd) build_etcd ;;
    helm) build_helm ;;
    kueue) build_kueue ;;
    all) build_etcd; build_kubernetes; build_helm; build_kueue ;;
    *) echo "usage: $0 [kubernetes|etcd|helm|kueue|all]" >&2; exit 2 ;;
  esac
  echo "build-tools: ${1:-all} ready after $((SECONDS - t0)) s (cache: $TOOLS)"
}

main "$@"
