// Package e2e is ironlb's end-to-end suite: the users' walkthrough
// (examples/walkthrough) and the failure, configuration and bad-input
// scenarios around it, run against a real cluster.
//
// The suite talks only to a kubeconfig and to a Hosts implementation that
// runs commands on the external client (mypc) and on the nodes: the lab's
// (test/lab, network namespaces) or docker exec for a kind cluster. Its files
// carry the build tag e2e, so `go test ./...` does not bring a cluster up:
//
//	sudo make test-e2e                  # brings the lab up, installs the chart, tears down
//	E2E_KUBECONFIG=.lab/kubeconfig E2E_HOSTS=lab go test -tags e2e ./test/e2e -v   # a running lab
//	E2E_KUBECONFIG=$HOME/.kube/config E2E_HOSTS=docker E2E_CLIENT=mypc go test -tags e2e ./test/e2e -v  # kind
//
// See main_test.go for every variable.
package e2e
