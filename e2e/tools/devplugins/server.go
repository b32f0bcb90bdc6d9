package devplugins

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// plugin is the gRPC DevicePlugin service of one Resource.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource Resource
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: p.resource.Prefer != nil}, nil
}

// ListAndWatch sends the devices once; they never change health, so the stream then waits for its end.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.resource.Devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	if p.resource.Prefer == nil {
		return nil, fmt.Errorf("%s gives no preferred allocation", p.resource.Name)
	}
	out := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		ids := p.resource.Prefer(c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize))
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return out, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		answer, err := p.resource.Allocate(c.DevicesIds)
		if err != nil {
			return nil, err
		}
		log.Printf("%s: allocated %v", p.resource.Name, c.DevicesIds)
		out.ContainerResponses = append(out.ContainerResponses, answer)
	}
	return out, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Serve runs the resources' plugins in the kubelet's device-plugins directory `dir` until ctx ends.
// A kubelet that (re)starts removes every socket there and makes kubelet.sock anew: each time that
// socket appears, every plugin serves on a fresh socket and registers again, as real plugins do.
func Serve(ctx context.Context, dir string, resources []Resource) error {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer watcher.Close()
	if err := watcher.Add(dir); err != nil {
		return err
	}
	kubeletSocket := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	// A registration that fails (the kubelet went away meanwhile) waits for the next kubelet.sock.
	start := func() {
		if stop != nil {
			stop()
		}
		if stop, err = serveAndRegister(ctx, dir, kubeletSocket, resources); err != nil {
			log.Print(err)
		}
	}
	if _, err := os.Stat(kubeletSocket); err == nil {
		start()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-watcher.Errors:
			return err
		case event := <-watcher.Events:
			if event.Name == kubeletSocket && event.Has(fsnotify.Create) {
				log.Printf("%s appeared: registering", kubeletSocket)
				start()
			}
		}
	}
}

func serveAndRegister(ctx context.Context, dir, kubeletSocket string, resources []Resource) (func(), error) {
	servers := []*grpc.Server{}
	stop := func() {
		for _, s := range servers {
			s.Stop()
		}
	}
	for _, r := range resources {
		path := filepath.Join(dir, r.Socket)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			stop()
			return nil, err
		}
		listener, err := net.Listen("unix", path)
		if err != nil {
			stop()
			return nil, err
		}
		server := grpc.NewServer()
		pluginapi.RegisterDevicePluginServer(server, &plugin{resource: r})
		servers = append(servers, server)
		go server.Serve(listener) //nolint:errcheck // ends with Stop
		if err := register(ctx, kubeletSocket, r); err != nil {
			return stop, err
		}
		log.Printf("registered %s", r.Describe())
	}
	return stop, nil
}

func register(ctx context.Context, kubeletSocket string, r Resource) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	// the socket file appears at bind, a moment before the kubelet listens: wait for it to answer
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     r.Socket,
		ResourceName: r.Name,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: r.Prefer != nil},
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("register %s with %s: %w", r.Name, kubeletSocket, err)
	}
	return nil
}
