// Command pulumi-language-python is the project's Python language host for the Pulumi CLI
// (ADR 0035).
//
// Upstream's host is the Go module github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3,
// which Pulumi never tags, so the Go module proxy serves no version of it; without a Python host the
// CLI runs no Python program and no Python policy pack. This is a smaller host written for this
// project on the Pulumi SDK (github.com/pulumi/pulumi/sdk/v3) of the CLI's own release: the same
// gRPC service (pulumirpc.LanguageRuntime), the same Python environments (the SDK's python/toolchain
// package reads Pulumi.yaml's toolchain/virtualenv options), and only what `pulumi preview`, `up`,
// `destroy`, `about` and `--policy-pack` need:
//
//   - Run: runs the program with exec.py (embedded, run as `python -c`), the stack's configuration in
//     PULUMI_CONFIG and PULUMI_CONFIG_SECRET_KEYS, the settings as arguments;
//   - RunPlugin: a policy pack runs as `python -u -m pulumi.policy <engine> <pack folder>` (the
//     runner module ships with the pulumi Python SDK), behind the SDK's PolicyProxy, which gives the
//     pack its stack's name and configuration as environment variables; any other Python plugin as
//     `python <folder> <args>`;
//   - GetRequiredPackages: the pulumi-plugin.json of each installed Python package (packages.py);
//   - GetPluginInfo, About, GetProgramDependencies, Handshake, Cancel.
//
// Everything else (new projects, code generation, packing, linking, installing dependencies) answers
// Unimplemented: the project's environments are made by `make venv`, not by the CLI.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/blang/semver"
	sdk "github.com/pulumi/pulumi/sdk/v3"
	"github.com/pulumi/pulumi/sdk/v3/go/common/apitype"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

//go:embed exec.py
var execScript string

//go:embed packages.py
var packagesScript string

// exec.py exits with this status after it reported the error through the engine itself.
const errorAlreadyShown = 32

func main() {
	flag.String("tracing", "", "accepted for compatibility with the engine's plugin arguments; unused")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Version)
		return
	}
	engine := flag.Arg(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cancel := make(chan bool)
	go func() {
		<-ctx.Done()
		close(cancel)
	}()
	if engine != "" {
		// Exit when the engine goes away, as every plugin does.
		if err := rpcutil.Healthcheck(ctx, engine, 5*time.Minute, stop); err != nil {
			fail(fmt.Errorf("cannot watch the engine at %s: %w", engine, err))
		}
	}
	host := newHost(engine)
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host)
			return nil
		},
		Options: rpcutil.TracingServerInterceptorOptions(nil),
	})
	if err != nil {
		fail(fmt.Errorf("cannot serve the language runtime: %w", err))
	}
	// The engine reads the port from the first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fail(fmt.Errorf("language runtime stopped: %w", err))
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
	os.Exit(1)
}

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	engine string
	// cancelled by the Cancel RPC: stops a running program.
	cancelCtx  context.Context
	cancelFunc context.CancelFunc
}

func newHost(engine string) *host {
	ctx, cancel := context.WithCancel(context.Background())
	return &host{engine: engine, cancelCtx: ctx, cancelFunc: cancel}
}

// pythonOptions reads Pulumi.yaml's runtime options (toolchain, virtualenv) as the upstream host
// does; a plugin (not a program) defaults to the virtual environment "venv" in its folder.
func pythonOptions(info *pulumirpc.ProgramInfo, isPlugin bool) (toolchain.PythonOptions, error) {
	if info == nil {
		return toolchain.PythonOptions{}, errors.New("the request carries no program information")
	}
	opts := toolchain.PythonOptions{Root: info.RootDirectory, ProgramDir: info.ProgramDirectory}
	options := info.Options.AsMap()
	for key, value := range options {
		text, ok := value.(string)
		if !ok {
			return opts, fmt.Errorf("runtime option %q must be a string", key)
		}
		switch key {
		case "virtualenv":
			opts.Virtualenv = text
		case "toolchain":
			switch text {
			case "pip":
				opts.Toolchain = toolchain.Pip
			case "uv":
				opts.Toolchain = toolchain.Uv
			case "poetry":
				opts.Toolchain = toolchain.Poetry
			default:
				return opts, fmt.Errorf("unknown toolchain %q (pip, uv or poetry)", text)
			}
		case "typechecker":
			if text != "" {
				return opts, fmt.Errorf("runtime option typechecker=%s is not supported by this host", text)
			}
		default:
			return opts, fmt.Errorf("unknown runtime option %q", key)
		}
	}
	if isPlugin && opts.Virtualenv == "" && (opts.Toolchain == toolchain.Pip || opts.Toolchain == toolchain.Auto) {
		opts.Virtualenv = "venv"
	}
	return opts, nil
}

// python resolves the program's Python environment and checks that it exists.
func python(ctx context.Context, info *pulumirpc.ProgramInfo, isPlugin bool) (toolchain.Toolchain, error) {
	opts, err := pythonOptions(info, isPlugin)
	if err != nil {
		return nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, fmt.Errorf("the Python environment of %s is not usable (create it with `make venv`, "+
			"or the folder named by runtime.options.virtualenv): %w", info.ProgramDirectory, err)
	}
	return tc, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version.Version}, nil
}

func (h *host) Handshake(
	ctx context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.engine = req.EngineAddress
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	h.cancelFunc()
	return &emptypb.Empty{}, nil
}

// installedPackage is one line of packages.py's output.
type installedPackage struct {
	Package        string                  `json:"package"`
	PackageVersion string                  `json:"package_version"`
	Plugin         plugin.PulumiPluginJSON `json:"plugin"`
}

func (h *host) GetRequiredPackages(
	ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	tc, err := python(ctx, req.Info, false)
	if err != nil {
		return nil, err
	}
	cmd, err := tc.Command(ctx, "-c", packagesScript)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the Pulumi packages of the Python environment: %w", err)
	}
	var installed []installedPackage
	if err := json.Unmarshal(out, &installed); err != nil {
		return nil, fmt.Errorf("reading the list of Pulumi packages: %w", err)
	}
	var deps []*pulumirpc.PackageDependency
	for _, p := range installed {
		dep, err := dependency(p)
		if err != nil {
			return nil, err
		}
		if dep != nil {
			deps = append(deps, dep)
		}
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: deps}, nil
}

// dependency is the plugin a Python package asks for: its pulumi-plugin.json's name and version,
// else the package's name less "pulumi_"/"pulumi-" and its version; none when resource is false.
func dependency(p installedPackage) (*pulumirpc.PackageDependency, error) {
	if !p.Plugin.Resource {
		return nil, nil
	}
	name := p.Plugin.Name
	if name == "" {
		name = strings.TrimPrefix(strings.ReplaceAll(p.Package, "_", "-"), "pulumi-")
	}
	v := p.Plugin.Version
	if v == "" {
		v = p.PackageVersion
	}
	parsed, err := semver.ParseTolerant(v)
	if err != nil {
		return nil, fmt.Errorf("package %s asks for plugin %s at %q, which is not a semantic version: %w",
			p.Package, name, v, err)
	}
	dep := &pulumirpc.PackageDependency{
		Kind:    string(apitype.ResourcePlugin),
		Name:    name,
		Version: "v" + parsed.String(),
		Server:  p.Plugin.Server,
	}
	if pz := p.Plugin.Parameterization; pz != nil {
		dep.Parameterization = &pulumirpc.PackageParameterization{Name: pz.Name, Version: pz.Version, Value: pz.Value}
	}
	return dep, nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	tc, err := python(ctx, req.Info, false)
	if err != nil {
		return nil, err
	}
	args := []string{"-c", execScript}
	flagArg := func(name, value string) {
		if value != "" {
			args = append(args, "--"+name, value)
		}
	}
	flagArg("monitor", req.MonitorAddress)
	flagArg("engine", h.engine)
	flagArg("project", req.Project)
	flagArg("root_directory", req.Info.RootDirectory)
	flagArg("stack", req.Stack)
	flagArg("pwd", req.Pwd)
	flagArg("dry_run", strconv.FormatBool(req.DryRun))
	flagArg("parallel", strconv.Itoa(int(req.Parallel)))
	flagArg("organization", req.Organization)
	args = append(args, req.Info.EntryPoint)
	args = append(args, req.Args...)

	config, err := json.Marshal(req.Config)
	if err != nil {
		return nil, err
	}
	secretKeys := req.ConfigSecretKeys
	if secretKeys == nil {
		secretKeys = []string{}
	}
	keys, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}

	runCtx, stop := context.WithCancel(h.cancelCtx)
	defer stop()
	context.AfterFunc(ctx, stop)
	cmd, err := tc.Command(runCtx, args...)
	if err != nil {
		return nil, err
	}
	// Interrupt first so that the program can finish its pending operations; kill after 5 s.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(keys))

	err = cmd.Run()
	// The engine shows what the program printed: flush it before answering.
	_ = os.Stdout.Sync()
	_ = os.Stderr.Sync()
	if err == nil {
		return &pulumirpc.RunResponse{}, nil
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not run the Python program: %v", err)}, nil
	}
	if exitErr.ExitCode() == errorAlreadyShown {
		return &pulumirpc.RunResponse{Bail: true}, nil
	}
	return &pulumirpc.RunResponse{Error: fmt.Sprintf("the Python program exited with status %d", exitErr.ExitCode())}, nil
}

func (h *host) RunPlugin(req *pulumirpc.RunPluginRequest, server pulumirpc.LanguageRuntime_RunPluginServer) error {
	ctx := server.Context()
	isPolicyPack := req.Kind == string(apitype.AnalyzerPlugin)
	tc, err := python(ctx, req.Info, !isPolicyPack)
	if err != nil {
		return err
	}
	var args []string
	if isPolicyPack {
		// The engine passes its address; the runner wants the pack's folder last.
		args = append(append([]string{"-u", "-m", "pulumi.policy"}, req.Args...), req.Info.ProgramDirectory)
	} else {
		args = append([]string{req.Info.ProgramDirectory}, req.Args...)
	}
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	closer, stdout, stderr, err := rpcutil.MakeRunPluginStreams(server, false)
	if err != nil {
		return err
	}
	defer closer.Close()

	var proxy *sdk.PolicyProxy
	if isPolicyPack {
		// A policy pack runs in its own folder and learns its stack from the environment: the
		// proxy answers the engine's first calls, hands over the stack's configuration, then
		// forwards everything to the pack once it listens.
		cmd.Dir = req.Info.ProgramDirectory
		proxy, stdout, err = sdk.NewPolicyProxy(ctx, stdout)
		if err != nil {
			return fmt.Errorf("could not start the policy pack proxy: %w", err)
		}
		stack, err := proxy.AwaitConfiguration(ctx)
		if err != nil {
			return fmt.Errorf("could not get the stack's configuration for the policy pack: %w", err)
		}
		if stack != nil {
			set := func(k, v string) {
				if v != "" {
					cmd.Env = append(cmd.Env, k+"="+v)
				}
			}
			set("PULUMI_ORGANIZATION", stack.Organization)
			set("PULUMI_PROJECT", stack.Project)
			set("PULUMI_STACK", stack.Stack)
			set("PULUMI_DRY_RUN", strconv.FormatBool(stack.DryRun))
			if stack.Config != nil {
				config, err := json.Marshal(stack.Config)
				if err != nil {
					return err
				}
				set("PULUMI_CONFIG", string(config))
			}
		}
	} else {
		cmd.Dir = req.Pwd
	}
	cmd.Env = append(cmd.Env, req.Env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr

	if err := cmd.Start(); err != nil {
		if proxy != nil {
			proxy.Abort(err)
		}
		return fmt.Errorf("could not start the Python plugin: %w", err)
	}
	if proxy != nil {
		err = proxy.Attach(ctx, cmd)
	} else {
		err = cmd.Wait()
	}
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if status, ok := exitErr.Sys().(syscall.WaitStatus); ok {
				return server.Send(&pulumirpc.RunPluginResponse{
					Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: int32(status.ExitStatus())},
				})
			}
		}
		return fmt.Errorf("the Python plugin failed: %w", err)
	}
	return closer.Close()
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	tc, err := python(ctx, req.Info, false)
	if err != nil {
		return nil, err
	}
	info, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{Executable: info.PythonExecutable, Version: info.PythonVersion.String()}, nil
}

func (h *host) GetProgramDependencies(
	ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	tc, err := python(ctx, req.Info, false)
	if err != nil {
		return nil, err
	}
	pkgs, err := tc.ListPackages(ctx, req.TransitiveDependencies)
	if err != nil {
		return nil, err
	}
	deps := make([]*pulumirpc.DependencyInfo, 0, len(pkgs))
	for _, p := range pkgs {
		deps = append(deps, &pulumirpc.DependencyInfo{Name: p.Name, Version: p.Version})
	}
	return &pulumirpc.GetProgramDependenciesResponse{Dependencies: deps}, nil
}
