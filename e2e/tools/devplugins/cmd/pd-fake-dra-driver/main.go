// pd-fake-dra-driver is a fake node's AMD GPU DRA driver (gpu.amd.com): it registers with the node's
// kubelet through the plugin watcher's directory, answers the kubelet's NodePrepareResources and
// NodeUnprepareResources, and publishes the node's ResourceSlice with the devices of -devices, with the
// credentials of -kubeconfig (the driver's own ServiceAccount).
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"pd-operator.local/e2e/devplugins/dra"
)

func main() {
	node := flag.String("node", "", "the node's name: the driver's pool, where its ResourceSlice is")
	devicesFile := flag.String("devices", "", "JSON list of the node's devices (resource.k8s.io/v1 Device)")
	kubeconfig := flag.String("kubeconfig", "", "the driver's credentials for ResourceClaims and ResourceSlices")
	registry := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin watcher directory")
	pluginDir := flag.String("plugin-dir", kubeletplugin.KubeletPluginsDir+"/"+dra.DriverName, "where the DRA service socket goes")
	eventsFile := flag.String("events", "", "file the kubelet's prepare and unprepare calls are appended to (JSON lines)")
	flag.Parse()
	if *node == "" || *devicesFile == "" || *kubeconfig == "" || *eventsFile == "" {
		log.Fatal("-node, -devices, -kubeconfig and -events are required")
	}
	devices, err := dra.LoadDevices(*devicesFile)
	if err != nil {
		log.Fatal(err)
	}
	client, err := clientOf(*kubeconfig)
	if err != nil {
		log.Fatal(err)
	}
	events, err := os.OpenFile(*eventsFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	if err := os.MkdirAll(*pluginDir, 0o750); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	failed := make(chan error, 1)
	driver := dra.New(*node, devices, events, func(err error) {
		select {
		case failed <- err:
		default: // the first one is enough
		}
	})
	helper, err := kubeletplugin.Start(ctx, driver,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(dra.DriverName),
		kubeletplugin.RegistrarDirectoryPath(*registry),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, dra.Resources(*node, devices)); err != nil {
		log.Fatal(err)
	}
	log.Printf("%s serving node %s's %d devices", dra.DriverName, *node, len(devices))
	go driver.AwaitRegistration(ctx, helper)
	select {
	case <-ctx.Done():
		log.Print("stopping")
	case err := <-failed:
		helper.Stop()
		log.Fatal(err)
	}
}

func clientOf(kubeconfig string) (kubernetes.Interface, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(config)
}
