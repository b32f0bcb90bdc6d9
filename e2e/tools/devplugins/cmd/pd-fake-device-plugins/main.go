// pd-fake-device-plugins serves a fake MI300X node's GPUs and RDMA NICs to a kubelet through its
// device-plugin API: it makes the device nodes and sysfs classes under -root, then registers
// amd.com/gpu, rdma/hca_shared_devices_a and amd.com/nic on the kubelet's socket in -dir.
package main

import (
	"context"
	"flag"
	"log"
	"os/signal"
	"syscall"

	"pd-operator.local/e2e/devplugins"
)

func main() {
	dir := flag.String("dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugins directory")
	node := devplugins.Node{}
	flag.StringVar(&node.Root, "root", "", "directory for the node's fake device nodes and sysfs classes")
	flag.IntVar(&node.GPUs, "gpus", 8, "MI300X GPUs (amd.com/gpu)")
	flag.IntVar(&node.NICs, "nics", 8, "RoCE NICs (rdma/hca_shared_devices_a, amd.com/nic); 0 for none")
	flag.IntVar(&node.NUMANodes, "numa-nodes", 2, "NUMA nodes (CPU sockets); GPUs and NICs spread evenly")
	flag.BoolVar(&node.NoUVerbs, "no-uverbs", false,
		"a misconfigured node without ib_uverbs: the RDMA resources stay advertised, but no uverbs node exists or is handed out")
	kfdMajor := flag.Uint("kfd-major", 510, "char major of /dev/kfd (the kernel's is dynamic)")
	cmMinor := flag.Uint("rdma-cm-minor", 58, "misc minor of /dev/infiniband/rdma_cm (dynamic on a real node)")
	flag.Parse()
	if node.Root == "" {
		log.Fatal("-root is required")
	}
	node.KFDMajor, node.RDMACMMinor = uint32(*kfdMajor), uint32(*cmMinor)
	if err := node.WriteTree(); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if err := devplugins.Serve(ctx, *dir, node.Resources()); err != nil {
		log.Fatal(err)
	}
}
