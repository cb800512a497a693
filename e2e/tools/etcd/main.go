// Command etcd is etcd's own server entry point, built here so that the harness
// runs the etcd release that k8s.io/kubernetes pins (go.etcd.io/etcd/server/v3).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
