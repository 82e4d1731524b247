// Command pulumi-language-python is the project's Python language host for the Pulumi CLI
// (ADR 0035).
//
// Upstream's host is the Go module github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3,
// which Pulumi never tags, so the Go module proxy serves no version of it; without a Python host the
// CLI runs no Python program and no Python policy pack. This host is written for this project on the
// Pulumi SDK (github.com/pulumi/pulumi/sdk/v3) of the CLI's own release: it serves the gRPC service
// pulumirpc.LanguageRuntime, finds Python environments with the SDK's python/toolchain package
// (Pulumi.yaml's toolchain and virtualenv options), and does only what `pulumi preview`, `up`,
// `destroy`, `about` and `--policy-pack` need:
//
//   - Run: runner.py (embedded, run as `python -c`) with one JSON run document in the environment
//     (runDocument: program, arguments, configuration, the engine's settings);
//   - RunPlugin: a policy pack as `python -u -m pulumi.policy <engine> <pack folder>` (the module
//     ships with the pulumi Python SDK) behind the SDK's PolicyProxy, which gives the pack its
//     stack's name and configuration as environment variables; any other Python plugin as
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
	"sort"
	"strconv"
	"strings"
	"sync"
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

//go:embed runner.py
var runnerScript string

//go:embed packages.py
var packagesScript string

// runner.py exits with this status after it logged the program's error through the engine: the
// engine must not print another (RunResponse.Bail).
const errorLogged = 32

// A program asked to stop (Ctrl-C in the CLI, the Cancel RPC) gets SIGINT, so the SDK can finish
// the registrations in flight; it is killed if it is still running after this long.
const stopGrace = 5 * time.Second

func main() {
	flag.String("tracing", "", "the engine's tracing endpoint (accepted; this host does not trace)")
	printVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *printVersion {
		fmt.Println(version.Version)
		return
	}
	if err := serve(flag.Arg(0)); err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
		os.Exit(1)
	}
}

// serve answers the engine at `engine` (empty when started by hand) until it goes away or an
// interrupt arrives. The engine learns the port from the first line this host prints.
func serve(engine string) error {
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if engine != "" {
		if err := rpcutil.Healthcheck(interrupted, engine, 5*time.Minute, stop); err != nil {
			return fmt.Errorf("watching the engine at %s: %w", engine, err)
		}
	}
	quit := make(chan bool)
	go func() {
		<-interrupted.Done()
		close(quit)
	}()
	h := &host{engine: engine, cancelled: make(chan struct{})}
	server, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel:  quit,
		Init:    func(s *grpc.Server) error { pulumirpc.RegisterLanguageRuntimeServer(s, h); return nil },
		Options: rpcutil.TracingServerInterceptorOptions(nil),
	})
	if err != nil {
		return fmt.Errorf("serving the language runtime: %w", err)
	}
	fmt.Println(server.Port)
	return <-server.Done
}

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	engine     string
	cancelled  chan struct{} // closed by the Cancel RPC
	cancelOnce sync.Once
}

// pythonOptions reads Pulumi.yaml's (or PulumiPolicy.yaml's) runtime options. Every environment
// of this project is named there (virtualenv), so none is guessed.
func pythonOptions(info *pulumirpc.ProgramInfo) (toolchain.PythonOptions, error) {
	if info == nil {
		return toolchain.PythonOptions{}, errors.New("the request carries no program information")
	}
	opts := toolchain.PythonOptions{Root: info.RootDirectory, ProgramDir: info.ProgramDirectory}
	for key, value := range info.Options.AsMap() {
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
	if opts.Virtualenv == "" && (opts.Toolchain == toolchain.Pip || opts.Toolchain == toolchain.Auto) {
		return opts, fmt.Errorf("%s: name the Python environment in runtime.options.virtualenv",
			info.ProgramDirectory)
	}
	return opts, nil
}

// python resolves the program's Python environment and checks that it exists.
func python(ctx context.Context, info *pulumirpc.ProgramInfo) (toolchain.Toolchain, error) {
	opts, err := pythonOptions(info)
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

// Cancel stops every program this host runs (each is interrupted, then killed after a grace).
func (h *host) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	h.cancelOnce.Do(func() { close(h.cancelled) })
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
	tc, err := python(ctx, req.Info)
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

// runDocument is what runner.py reads from GPUFLEET_PULUMI_RUN.
type runDocument struct {
	Program    string            `json:"program"`
	Args       []string          `json:"args"`
	Pwd        string            `json:"pwd"`
	Config     map[string]string `json:"config"`
	SecretKeys []string          `json:"secretKeys"`
	Settings   runSettings       `json:"settings"`
}

type runSettings struct {
	Project       string `json:"project"`
	Stack         string `json:"stack"`
	Organization  string `json:"organization"`
	RootDirectory string `json:"rootDirectory"`
	Monitor       string `json:"monitor"`
	Engine        string `json:"engine"`
	DryRun        bool   `json:"dryRun"`
	Parallel      int32  `json:"parallel"`
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	tc, err := python(ctx, req.Info)
	if err != nil {
		return nil, err
	}
	doc := runDocument{
		Program:    req.Info.EntryPoint,
		Args:       append([]string{}, req.Args...),
		Pwd:        req.Pwd,
		Config:     req.Config,
		SecretKeys: append([]string{}, req.ConfigSecretKeys...),
		Settings: runSettings{
			Project: req.Project, Stack: req.Stack, Organization: req.Organization,
			RootDirectory: req.Info.RootDirectory, Monitor: req.MonitorAddress, Engine: h.engine,
			DryRun: req.DryRun, Parallel: req.Parallel,
		},
	}
	if doc.Config == nil {
		doc.Config = map[string]string{}
	}
	encoded, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	// Not tied to ctx: a stop request interrupts the program first (watchStop), never kills it at once.
	cmd, err := tc.Command(context.Background(), "-c", runnerScript)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(cmd.Env, "GPUFLEET_PULUMI_RUN="+string(encoded))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not start Python for %s: %v", doc.Program, err)}, nil
	}
	exited := make(chan struct{})
	go h.watchStop(ctx, cmd, exited)
	err = cmd.Wait()
	close(exited)
	// What the program printed goes to the engine's display before the answer does.
	_ = os.Stdout.Sync()
	_ = os.Stderr.Sync()
	return runResponse(doc.Program, err), nil
}

// watchStop interrupts the program when the engine's request ends or Cancel is called, and kills
// it if it has not exited stopGrace later.
func (h *host) watchStop(ctx context.Context, cmd *exec.Cmd, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	case <-ctx.Done():
	case <-h.cancelled:
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(stopGrace):
		_ = cmd.Process.Kill()
	}
}

// runResponse turns the runner's exit into the engine's answer.
func runResponse(program string, err error) *pulumirpc.RunResponse {
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return &pulumirpc.RunResponse{}
	case !errors.As(err, &exitErr):
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("running %s: %v", program, err)}
	case exitErr.ExitCode() == errorLogged:
		return &pulumirpc.RunResponse{Bail: true}
	default:
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("%s: Python exited with status %d", program, exitErr.ExitCode())}
	}
}

// policyEnv is what a policy pack learns of its stack, as the pulumi.policy module reads it.
func policyEnv(stack *pulumirpc.AnalyzerStackConfigureRequest) ([]string, error) {
	vars := map[string]string{
		"PULUMI_ORGANIZATION": stack.Organization,
		"PULUMI_PROJECT":      stack.Project,
		"PULUMI_STACK":        stack.Stack,
		"PULUMI_DRY_RUN":      strconv.FormatBool(stack.DryRun),
	}
	if stack.Config != nil {
		config, err := json.Marshal(stack.Config)
		if err != nil {
			return nil, err
		}
		vars["PULUMI_CONFIG"] = string(config)
	}
	var env []string
	for k, v := range vars {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	sort.Strings(env)
	return env, nil
}

func (h *host) RunPlugin(req *pulumirpc.RunPluginRequest, server pulumirpc.LanguageRuntime_RunPluginServer) error {
	ctx := server.Context()
	policyPack := req.Kind == string(apitype.AnalyzerPlugin)
	tc, err := python(ctx, req.Info)
	if err != nil {
		return err
	}
	args := append([]string{req.Info.ProgramDirectory}, req.Args...)
	if policyPack {
		// The engine's address first, the pack's folder last.
		args = append(append([]string{"-u", "-m", "pulumi.policy"}, req.Args...), req.Info.ProgramDirectory)
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
	cmd.Dir = req.Pwd
	var proxy *sdk.PolicyProxy
	if policyPack {
		// The proxy answers the engine's first calls for the pack, which starts only once it knows
		// its stack (from the environment), then forwards everything to it.
		cmd.Dir = req.Info.ProgramDirectory
		if proxy, stdout, err = sdk.NewPolicyProxy(ctx, stdout); err != nil {
			return fmt.Errorf("policy pack %s: %w", req.Info.ProgramDirectory, err)
		}
		stack, err := proxy.AwaitConfiguration(ctx)
		if err != nil {
			return fmt.Errorf("policy pack %s: waiting for its stack's configuration: %w", req.Info.ProgramDirectory, err)
		}
		if stack != nil {
			env, err := policyEnv(stack)
			if err != nil {
				return err
			}
			cmd.Env = append(cmd.Env, env...)
		}
	}
	cmd.Env = append(cmd.Env, req.Env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		if proxy != nil {
			proxy.Abort(err)
		}
		return fmt.Errorf("starting Python for %s: %w", req.Info.ProgramDirectory, err)
	}
	if proxy != nil {
		err = proxy.Attach(ctx, cmd)
	} else {
		err = cmd.Wait()
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return closer.Close()
	case errors.As(err, &exitErr):
		// The plugin's own status, for the engine to report.
		return server.Send(&pulumirpc.RunPluginResponse{
			Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: int32(exitErr.ExitCode())},
		})
	default:
		return fmt.Errorf("%s: %w", req.Info.ProgramDirectory, err)
	}
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	tc, err := python(ctx, req.Info)
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
	tc, err := python(ctx, req.Info)
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
