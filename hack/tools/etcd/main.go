// Command etcd is the etcd server at the version k8s.io/kubernetes pins, built from
// the Go module proxy so the lab and envtest need no downloaded release archive.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
