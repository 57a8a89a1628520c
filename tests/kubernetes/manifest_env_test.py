#!/usr/bin/env python3
"""The Kubernetes manifests' environment contract (examples/kubernetes).

For each manifest and each of its pods, this builds the container's environment as the cluster
would: the manifest's own env, what its controller injects (the training operator's PET_
variables, the Job controller's JOB_COMPLETION_INDEX, downward-API fields, the Secret), then the
kubelet's $(VAR) expansion of command and args. It runs `launch --dry-run <command and args>`
with exactly that environment (env -i, plus PATH) and checks launch's plan against the job:
workers per node, each worker's ranks and sizes (in the environment the worker would get: the
pod's, with what launch sets over it), the rendezvous endpoint or the static master, exit 0.
Broken values must exit 2 with one line naming the variable. The elastic PyTorchJob is also run
as a non-elastic Master + Worker job (no elasticPolicy, the operator's PET_MASTER_ADDR/PORT and
PET_NODE_RANK, no endpoint), which launch must plan as torchrun's default static ranks. One real
single-node launch per manifest with the pod's environment checks that the Secret's
LAUNCH_RDZV_TOKEN does not reach the worker while the rest of the environment does.

Where it can (root, mount and UTS namespaces), each pod runs with the pod's host name and a
kubelet-style /etc/hosts, twice: once with it also answering, as cluster DNS would, the names of
the job's other pods, and once before cluster DNS knows any of them (the kubelet's own lines
only; the manifests have no init container that waits for a name). Either way the pod whose
address the endpoint is hosts the coordinator ("hosted here") and the others join it; before DNS
they say once that the name does not resolve yet and join it all the same (exit 0). Without
namespaces every pod joins and those assertions are left out.

usage: manifest_env_test.py --launch PATH --manifests DIR [--train-mlp PATH] [--no-namespaces]
"""

import argparse
import copy
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("manifest_env_test: Python's yaml module is missing (Debian: apt-get install python3-yaml)",
          file=sys.stderr)
    sys.exit(1)

# --------------------------------------------------------------------------------------------
# What the controllers inject, written down from their sources.
# --------------------------------------------------------------------------------------------

# The test Secret: `kubectl create secret generic launch-rdzv-token --from-literal=token=...`.
SECRETS = {("launch-rdzv-token", "token"): "k8s-manifest-test-token-0123456789abcdef"}
NAMESPACE = "default"
CLUSTER_DOMAIN = "cluster.local"

# training-operator (kubeflow/training-operator, v1.7.0-v1.9.0):
#   pkg/apis/kubeflow.org/v1/pytorch_types.go: the container "pytorch", its port "pytorchjob-port"
#   (default 23456); pytorch_defaults.go setDefaultNprocPerNode: spec.nprocPerNode defaults to
#   "auto" unless elasticPolicy.nProcPerNode is set.
#   pkg/controller.v1/pytorch/envvar.go setPodEnv: PYTHONUNBUFFERED=1; with a Master replica
#   master.go's MASTER_PORT, PET_MASTER_PORT, MASTER_ADDR, PET_MASTER_ADDR (<job>-master-0), then
#   WORLD_SIZE (replicas x nproc), RANK and PET_NODE_RANK (master 0, worker i+1); PET_NPROC_PER_NODE
#   from spec.nprocPerNode; elastic.go's variables with an elasticPolicy, else PET_NNODES=replicas.
#   elastic.go Generate: PET_RDZV_ENDPOINT (rdzvHost or <job>-worker-0, rdzvPort or the Worker's
#   pytorchjob-port), PET_RDZV_BACKEND (default c10d), PET_NNODES (min:max, or Worker replicas),
#   PET_MAX_RESTARTS, PET_NPROC_PER_NODE (elasticPolicy.nProcPerNode), PET_RDZV_ID, PET_RDZV_CONF
#   (k=v,k=v), PET_STANDALONE="" (standalone: true). It declares PET_MONITOR_INTERVAL and
#   PET_START_METHOD but never sets them. (v1.4 spelled PET_N_PROC_PER_NODE; fixed in v1.5.0.)
#   pkg/controller.v1/common/service.go: a headless Service <job>-<type>-<i> per pod (no
#   publishNotReadyAddresses: the name resolves once the pod is Ready); the pod's name and so its
#   host name is <job>-<type>-<i>.
PYTORCHJOB_DEFAULT_PORT = 23456


def pytorchjob_pods(job):
    spec = job["spec"]
    name = job["metadata"]["name"]
    replicas = spec["pytorchReplicaSpecs"]
    elastic = spec.get("elasticPolicy")
    nproc = spec.get("nprocPerNode")
    if nproc is None and not (elastic and elastic.get("nProcPerNode") is not None):
        nproc = "auto"
    total = sum(int(r.get("replicas", 1)) for r in replicas.values())
    nproc_int = int(nproc) if isinstance(nproc, str) and nproc.isdigit() else 1
    pods = []
    for rtype in ("Master", "Worker"):
        if rtype not in replicas:
            continue
        rspec = replicas[rtype]
        for i in range(int(rspec.get("replicas", 1))):
            pod_name = f"{name}-{rtype.lower()}-{i}"
            template = rspec["template"]
            container = find_container(template["spec"], "pytorch")
            env = list(container.get("env", []))
            env.append(value_env("PYTHONUNBUFFERED", "1"))
            if "Master" in replicas:
                port = named_port(replicas["Master"]["template"]["spec"], "pytorch", "pytorchjob-port")
                addr = f"{name}-master-0"
                rank = i + 1 if rtype == "Worker" else i
                env += [value_env("MASTER_PORT", str(port)), value_env("PET_MASTER_PORT", str(port)),
                        value_env("MASTER_ADDR", addr), value_env("PET_MASTER_ADDR", addr),
                        value_env("WORLD_SIZE", str(total * nproc_int)), value_env("RANK", str(rank)),
                        value_env("PET_NODE_RANK", str(rank))]
            if nproc is not None:
                env.append(value_env("PET_NPROC_PER_NODE", str(nproc)))
            if elastic is not None:
                host = elastic.get("rdzvHost", f"{name}-worker-0")
                port = elastic.get("rdzvPort")
                if port is None:
                    port = named_port(replicas["Worker"]["template"]["spec"], "pytorch", "pytorchjob-port")
                env.append(value_env("PET_RDZV_ENDPOINT", f"{host}:{port}"))
                env.append(value_env("PET_RDZV_BACKEND", elastic.get("rdzvBackend", "c10d")))
                if elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None:
                    env.append(value_env("PET_NNODES", str(replicas["Worker"].get("replicas", 1))))
                else:
                    env.append(value_env("PET_NNODES", f"{elastic['minReplicas']}:{elastic['maxReplicas']}"))
                if elastic.get("maxRestarts") is not None:
                    env.append(value_env("PET_MAX_RESTARTS", str(elastic["maxRestarts"])))
                if elastic.get("nProcPerNode") is not None:
                    env.append(value_env("PET_NPROC_PER_NODE", str(elastic["nProcPerNode"])))
                if elastic.get("rdzvId") is not None:
                    env.append(value_env("PET_RDZV_ID", elastic["rdzvId"]))
                if elastic.get("rdzvConf"):
                    env.append(value_env("PET_RDZV_CONF",
                                         ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])))
                if elastic.get("standalone"):
                    env.append(value_env("PET_STANDALONE", ""))
            else:
                env.append(value_env("PET_NNODES", str(total)))
            pods.append(Pod(name=pod_name, hostname=pod_name, subdomain=None, labels={}, annotations={},
                            pod_spec=template["spec"], container=dict(container, env=env)))
    # Cluster DNS: the per-pod headless Services (the short name through the pod's search list).
    dns = {}
    for p in pods:
        for n in (p.name, f"{p.name}.{NAMESPACE}.svc", f"{p.name}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"):
            dns[n] = p
    return pods, dns


def as_master_worker(job):
    """The elastic PyTorchJob as a non-elastic one: no elasticPolicy, a Master replica (the Worker's
    template) and one Worker. The operator then gives PET_NNODES=2, PET_NODE_RANK (master 0,
    worker 1), PET_MASTER_ADDR=<job>-master-0, PET_MASTER_PORT (its pytorchjob-port) and
    PET_NPROC_PER_NODE, and no PET_RDZV_ENDPOINT: torchrun's static rendezvous."""
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "train-mlp-static"
    spec = job["spec"]
    spec.pop("elasticPolicy", None)
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    worker["replicas"] = 1
    spec["pytorchReplicaSpecs"] = {"Master": dict(copy.deepcopy(worker), replicas=1), "Worker": worker}
    return job


# JobSet (kubernetes-sigs/jobset, v0.6-v0.12), pkg/controllers/jobset_controller.go constructJob
# and labelAndAnnotateObject: Job <jobset>-<replicatedJob>-<j>; labels jobset.sigs.k8s.io/
# jobset-name, replicatedjob-name, job-index, restart-attempt; pod subdomain from network.subdomain
# (default: the JobSet's name, pkg/webhooks/jobset_webhook.go, which also defaults
# enableDNSHostnames and publishNotReadyAddresses to true and completionMode to Indexed);
# createHeadlessSvcIfNecessary makes that headless Service, so <hostname>.<subdomain> resolves.
# The Job controller (kubernetes/kubernetes pkg/controller/job/job_controller.go, indexed_job_utils.go):
# each pod's host name is <job>-<index>, its annotation (and, with PodIndexLabel, label)
# batch.kubernetes.io/job-completion-index=<index>, and addCompletionIndexEnvVariable appends
# JOB_COMPLETION_INDEX (a fieldRef to it) to every container that does not set it.
def jobset_pods(js, name=None):
    name = name or js["metadata"]["name"]
    spec = js["spec"]
    network = spec.get("network") or {}
    dns_hostnames = network.get("enableDNSHostnames", True)
    subdomain = network.get("subdomain", name) if dns_hostnames else None
    pods = []
    for rjob in spec["replicatedJobs"]:
        jspec = rjob["template"]["spec"]
        if jspec.get("completionMode", "Indexed") != "Indexed":
            raise Failure(f"{name}: replicated Job {rjob['name']} is not Indexed: no JOB_COMPLETION_INDEX")
        completions = int(jspec.get("completions", jspec.get("parallelism", 1)))
        for j in range(int(rjob.get("replicas", 1))):
            job_name = f"{name}-{rjob['name']}-{j}"
            for k in range(completions):
                labels = {"jobset.sigs.k8s.io/jobset-name": name,
                          "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                          "jobset.sigs.k8s.io/job-index": str(j),
                          "jobset.sigs.k8s.io/restart-attempt": "0",
                          "batch.kubernetes.io/job-completion-index": str(k)}
                annotations = {"batch.kubernetes.io/job-completion-index": str(k)}
                pod_spec = jspec["template"]["spec"]
                container = launch_container(pod_spec, job_name)
                env = list(container.get("env", []))
                if not any(e["name"] == "JOB_COMPLETION_INDEX" for e in env):
                    env.append(field_env("JOB_COMPLETION_INDEX",
                                         "metadata.annotations['batch.kubernetes.io/job-completion-index']"))
                pods.append(Pod(name=f"{job_name}-{k}", hostname=f"{job_name}-{k}", subdomain=subdomain,
                                labels=labels, annotations=annotations, pod_spec=pod_spec,
                                container=dict(container, env=env), job_name=rjob["name"]))
    dns = {}
    for p in pods:
        if p.subdomain:
            for n in (f"{p.hostname}.{p.subdomain}", f"{p.hostname}.{p.subdomain}.{NAMESPACE}.svc",
                      f"{p.hostname}.{p.subdomain}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"):
                dns[n] = p
    return pods, dns


# Kubeflow Trainer v2 (kubeflow/trainer, v2.0-v2.3): the TrainJob becomes a JobSet of the same
# name from its runtime's template (pkg/runtime/framework/plugins/jobset); trainer.numNodes sets
# the pod count of the Job labelled trainer.kubeflow.org/trainjob-ancestor-step=trainer, and
# trainer.image/command/args/env/resourcesPerNode override its container "node". The torch plugin
# (pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy; names in pkg/constants/constants.go)
# upserts PET_NNODES, PET_NPROC_PER_NODE (numProcPerNode, else "auto", which becomes the CPU
# request when no GPU is asked for), PET_NODE_RANK (a fieldRef to the completion index),
# PET_MASTER_ADDR=<trainjob>-node-0-0.<trainjob> and PET_MASTER_PORT=29500 (ContainerTrainerPort).
TRAINER_MASTER_PORT = 29500


def trainjob_pods(tj, runtimes):
    name = tj["metadata"]["name"]
    ref = tj["spec"]["runtimeRef"]
    runtime = runtimes.get((ref.get("kind", "ClusterTrainingRuntime"), ref["name"]))
    if runtime is None:
        raise Failure(f"TrainJob {name}: its runtime {ref['kind']}/{ref['name']} is not in the manifests")
    trainer = tj["spec"].get("trainer") or {}
    policy = runtime["spec"].get("mlPolicy") or {}
    if "torch" not in policy:
        raise Failure(f"TrainJob {name}: runtime {ref['name']} has no mlPolicy.torch: no PET_ variables")
    js = {"metadata": {"name": name}, "spec": yaml.safe_load(yaml.safe_dump(runtime["spec"]["template"]["spec"]))}
    num_nodes = int(trainer.get("numNodes", policy.get("numNodes", 1)))
    trainer_job = None
    for rjob in js["spec"]["replicatedJobs"]:
        labels = (rjob["template"].get("metadata") or {}).get("labels") or {}
        if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer":
            trainer_job = rjob
    if trainer_job is None or trainer_job["name"] != "node":
        raise Failure(f"TrainJob {name}: the runtime's trainer Job must be named 'node' (PET_MASTER_ADDR names it)")
    jspec = trainer_job["template"]["spec"]
    jspec["parallelism"] = jspec["completions"] = num_nodes
    container = find_container(jspec["template"]["spec"], "node")
    for key in ("image", "command", "args"):
        if key in trainer:
            container[key] = trainer[key]
    if "resourcesPerNode" in trainer:
        container["resources"] = trainer["resourcesPerNode"]
    env = list(container.get("env", []))
    for e in trainer.get("env", []):
        upsert(env, e)
    nproc = trainer.get("numProcPerNode")
    if nproc is None:
        res = container.get("resources") or {}
        gpus = any("gpu" in k for part in res.values() for k in part)
        cpu = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu") or 0
        nproc = "auto" if gpus else str(max(1, int(float(cpu))))
    for e in (value_env("PET_NNODES", str(num_nodes)), value_env("PET_NPROC_PER_NODE", str(nproc)),
              field_env("PET_NODE_RANK", "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
              value_env("PET_MASTER_ADDR", f"{name}-node-0-0.{name}"),
              value_env("PET_MASTER_PORT", str(TRAINER_MASTER_PORT))):
        upsert(env, e)
    container["env"] = env
    return jobset_pods(js, name)


# --------------------------------------------------------------------------------------------
# The kubelet's side: env values, $(VAR) expansion, /etc/hosts.
# --------------------------------------------------------------------------------------------

class Failure(Exception):
    pass


class Pod:
    def __init__(self, name, hostname, subdomain, labels, annotations, pod_spec, container, job_name=None):
        self.name, self.hostname, self.subdomain = name, hostname, subdomain
        self.labels, self.annotations = labels, annotations
        self.pod_spec, self.container, self.job_name = pod_spec, container, job_name
        self.ip = None


def value_env(name, value):
    return {"name": name, "value": value}


def field_env(name, path):
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def upsert(env, e):
    for i, old in enumerate(env):
        if old["name"] == e["name"]:
            env[i] = e
            return
    env.append(e)


def find_container(pod_spec, name):
    for c in pod_spec["containers"]:
        if c["name"] == name:
            return c
    raise Failure(f"no container named {name!r} (the controller looks for it)")


def launch_container(pod_spec, where):
    found = [c for c in pod_spec["containers"]
             if any(a == "launch" or a.endswith("/launch") for a in (c.get("command") or []) + (c.get("args") or []))]
    if len(found) != 1:
        raise Failure(f"{where}: expected one container that runs launch, found {len(found)}")
    return found[0]


def named_port(pod_spec, container, port_name):
    for p in find_container(pod_spec, container).get("ports", []):
        if p.get("name") == port_name:
            return p["containerPort"]
    return PYTORCHJOB_DEFAULT_PORT


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s, env):
    """Kubernetes' $(VAR) expansion: a defined variable is replaced, $$ is a $, the rest stays."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, s)


def field_value(pod, path):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        source = pod.labels if m.group(1) == "labels" else pod.annotations
        if m.group(2) not in source:
            raise Failure(f"{pod.name}: fieldRef {path}: no such {m.group(1)[:-1]} on the pod")
        return source[m.group(2)]
    if path == "metadata.name":
        return pod.name
    if path == "metadata.namespace":
        return NAMESPACE
    if path == "status.podIP":
        return pod.ip
    raise Failure(f"{pod.name}: fieldRef {path}: not modelled by this test")


def container_env(pod, secrets):
    """The container's environment as the kubelet makes it: in order, a later entry wins, values
    may refer to earlier ones with $(VAR)."""
    env = {}
    for e in pod.container.get("env", []):
        if "valueFrom" in e:
            src = e["valueFrom"]
            if "fieldRef" in src:
                value = field_value(pod, src["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in src:
                key = (src["secretKeyRef"]["name"], src["secretKeyRef"]["key"])
                if key not in secrets:
                    raise Failure(f"{pod.name}: env {e['name']}: no Secret {key[0]} with key {key[1]}")
                value = secrets[key]
            else:
                raise Failure(f"{pod.name}: env {e['name']}: {sorted(src)} not modelled by this test")
        else:
            value = expand(str(e.get("value", "")), env)
        env[e["name"]] = value
    return env


def secret_files(pod, secrets, root):
    """Writes the pod's Secret volumes under root, as mounted into the container. Returns
    {mountPath: directory}."""
    volumes = {v["name"]: v for v in pod.pod_spec.get("volumes", [])}
    mounts = {}
    for m in pod.container.get("volumeMounts", []):
        v = volumes.get(m["name"])
        if not v or "secret" not in v:
            continue
        d = os.path.join(root, m["mountPath"].lstrip("/"))
        os.makedirs(d, exist_ok=True)
        s = v["secret"]
        items = s.get("items") or [{"key": k, "path": k} for (n, k) in secrets if n == s["secretName"]]
        for item in items:
            key = (s["secretName"], item["key"])
            if key not in secrets:
                raise Failure(f"{pod.name}: volume {v['name']}: no Secret {key[0]} with key {key[1]}")
            with open(os.path.join(d, item["path"]), "w") as f:
                f.write(secrets[key])
        mounts[m["mountPath"]] = d
    return mounts


def hosts_file(pod, dns):
    """The kubelet's /etc/hosts (pkg/kubelet/kubelet_pods.go managedHostsFileContent: the pod's
    <hostname>.<subdomain>.<namespace>.svc.<cluster domain> and <hostname> on its address) plus, as
    cluster DNS would answer them, the job's stable names (none before DNS knows them)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    if pod.subdomain:
        lines.append(f"{pod.ip}\t{pod.hostname}.{pod.subdomain}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}\t{pod.hostname}")
    else:
        lines.append(f"{pod.ip}\t{pod.hostname}")
    for name, other in dns.items():
        lines.append(f"{other.ip}\t{name}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Running launch and reading its plan.
# --------------------------------------------------------------------------------------------

def local_ipv4():
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, set()
    ips = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    return (ips[0] if ips else None), set(ips)


def net_namespace_works():
    """Whether a command can run in a network namespace of its own (root, unshare, ip)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True).returncode == 0


def namespaces_work():
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        return False
    return subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True).returncode == 0


class Plan:
    """What launch --dry-run printed: its header, its settings and each worker's argv and env."""

    HEADER = re.compile(r"launch --dry-run: node rank (\d+) of (\S+), (\d+) worker\(s\) on this node"
                        r"(?:, rendezvous at (\S+) \((hosted here|another host's)\))?, run id (\S+)$")

    def __init__(self, stdout):
        self.header = None
        self.settings = {}
        self.workers = []
        worker = None
        for line in stdout.splitlines():
            m = self.HEADER.match(line)
            if m:
                self.header = m
                continue
            m = re.match(r"rank (\d+) \(local rank (\d+)\):$", line)
            if m:
                worker = {"rank": int(m.group(1)), "local_rank": int(m.group(2)), "argv": None, "env": {}}
                self.workers.append(worker)
                continue
            if worker is None:
                m = re.match(r"  ([a-z_]+) +(\S+) +(.+)$", line)
                if m:
                    self.settings[m.group(1)] = (m.group(2), m.group(3).strip())
                continue
            if line.startswith("  argv: "):
                worker["argv"] = line[len("  argv: "):]
            elif line.startswith("    ") and "=" in line:
                k, v = line.strip().split("=", 1)
                worker["env"][k] = v


class Runner:
    def __init__(self, launch, train_mlp, tmp):
        self.launch = os.path.abspath(launch)
        self.train_mlp = train_mlp
        self.tmp = tmp
        self.simulate = False
        self.self_ip, self.local_ips = local_ipv4()
        if self.self_ip and namespaces_work():
            self.simulate = True

    def pod_argv(self, pod, env, mounts):
        c = pod.container
        argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not argv:
            raise Failure(f"{pod.name}: the container has no command (the image has no ENTRYPOINT)")
        at = [i for i, a in enumerate(argv) if a == "launch" or a.endswith("/launch")]
        if not at:
            raise Failure(f"{pod.name}: launch is not in the container's command: {argv}")
        i = at[0]
        argv = argv[:i] + [self.launch, "--dry-run"] + argv[i + 1:]
        out = []
        for a in argv:
            if a == "/opt/launch/bin/train_mlp":
                a = self.train_mlp
            for path, d in mounts.items():
                a = a.replace(path + "/", d + "/")
            out.append(a)
        return out

    def run(self, pod, env, argv, dns):
        command = ["env", "-i", "PATH=/usr/bin:/bin"] + [f"{k}={v}" for k, v in env.items()] + argv
        if self.simulate:
            hosts = os.path.join(self.tmp, f"hosts.{pod.name}")
            with open(hosts, "w") as f:
                f.write(hosts_file(pod, dns))
            command = ["unshare", "--mount", "--uts", "--", "sh", "-c",
                       'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"',
                       hosts, pod.hostname] + command
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=self.tmp)
        except subprocess.TimeoutExpired as e:
            raise Failure(f"{pod.name}: launch --dry-run did not return within 60 s "
                          f"(stdout: {e.stdout!r}, stderr: {e.stderr!r})")
        return r


# --------------------------------------------------------------------------------------------
# The contract: what each manifest's pods must get from launch.
# --------------------------------------------------------------------------------------------

# Per case: the manifest, the object that makes the pods (optionally changed first), and for each
# pod (by index) what launch must plan.
#   node_rank: the node rank the dry run shows (a c10d job's real group ranks come from the
#     rendezvous; the dry run shows its node rank, 0 where the manifest gives none).
#   nnodes, workers, backend, run_id, max_restarts.
#   endpoint, hosted (this pod hosts the coordinator): c10d; endpoint None for static ranks.
#   master: static ranks: the MASTER_ADDR and MASTER_PORT every worker gets.
#   world: the WORLD_SIZE the dry run shows (an elastic job's: at its MAX nodes).
#   origins: where launch says a setting came from (a PET_ variable, JOB_COMPLETION_INDEX, a flag).
#   absent: settings that must not be there.
# token_check_on: the pod whose environment one real single-node launch is given (its worker
#   must not see LAUNCH_RDZV_TOKEN); only where the token comes as that variable.
TRAINJOB_ENDPOINT = f"train-mlp-trainjob-node-0-0.train-mlp-trainjob.{NAMESPACE}.svc.{CLUSTER_DOMAIN}:29400"
JOBSET_ENDPOINT = f"train-mlp-jobset-node-0-0.train-mlp-jobset.{NAMESPACE}.svc.{CLUSTER_DOMAIN}:29400"
STATIC_ORIGIN = "torchrun's default (a master address, no endpoint)"
CONTRACT = {
    "pytorchjob-elastic.yaml": {
        "file": "pytorchjob-elastic.yaml",
        "kind": "PyTorchJob",
        "pods": {
            0: dict(node_rank=0, nnodes="2:4", workers=2, backend="c10d", endpoint="train-mlp-elastic-worker-0:29400",
                    hosted=True, run_id="train-mlp-elastic", max_restarts=3, world=8, group_world=4,
                    origins={"nnodes": "PET_NNODES", "nproc_per_node": "PET_NPROC_PER_NODE",
                             "rdzv_backend": "PET_RDZV_BACKEND", "rdzv_endpoint": "PET_RDZV_ENDPOINT",
                             "rdzv_id": "PET_RDZV_ID", "max_restarts": "PET_MAX_RESTARTS"}),
            1: dict(node_rank=0, nnodes="2:4", workers=2, backend="c10d", endpoint="train-mlp-elastic-worker-0:29400",
                    hosted=False, run_id="train-mlp-elastic", max_restarts=3, world=8, group_world=4,
                    origins={"nnodes": "PET_NNODES", "node_rank": "default"}),
        },
        # Broken values, on pod broken_on: exit 2 and one line on stderr that starts with the prefix.
        "broken_on": 1,
        "broken": [({"env": {"PET_NNODES": "2:x"}}, "launch: PET_NNODES=2:x: "),
                   ({"env": {"PET_NPROC_PER_NODE": "two"}}, "launch: PET_NPROC_PER_NODE=two: "),
                   ({"env": {"PET_RDZV_CONF": "join_timeout=soon"}}, "launch: PET_RDZV_CONF=join_timeout=soon: "),
                   ({"secret": "short"}, "launch: LAUNCH_RDZV_TOKEN: ")],
        "token_check_on": 0,
    },
    # The same pods in a non-elastic Master + Worker PyTorchJob: torchrun's default static backend.
    "pytorchjob-elastic.yaml as Master + Worker": {
        "file": "pytorchjob-elastic.yaml",
        "kind": "PyTorchJob",
        "transform": as_master_worker,
        "pods": {
            0: dict(node_rank=0, nnodes="2", workers=2, backend="static", endpoint=None,
                    master=("train-mlp-static-master-0", "29400"), run_id="none", max_restarts=0, world=4,
                    group_world=2,
                    origins={"nnodes": "PET_NNODES", "node_rank": "PET_NODE_RANK",
                             "nproc_per_node": "PET_NPROC_PER_NODE", "rdzv_backend": STATIC_ORIGIN,
                             "master_addr": "PET_MASTER_ADDR", "master_port": "PET_MASTER_PORT"},
                    absent=["rdzv_endpoint"]),
            1: dict(node_rank=1, nnodes="2", workers=2, backend="static", endpoint=None,
                    master=("train-mlp-static-master-0", "29400"), run_id="none", max_restarts=0, world=4,
                    group_world=2,
                    origins={"nnodes": "PET_NNODES", "node_rank": "PET_NODE_RANK",
                             "nproc_per_node": "PET_NPROC_PER_NODE", "rdzv_backend": STATIC_ORIGIN,
                             "master_addr": "PET_MASTER_ADDR", "master_port": "PET_MASTER_PORT"},
                    absent=["rdzv_endpoint"]),
        },
        "broken_on": 1,
        "broken": [({"env": {"PET_NODE_RANK": "2"}}, "launch: PET_NODE_RANK=2: "),
                   ({"env": {"PET_MASTER_PORT": "http"}}, "launch: PET_MASTER_PORT=http: ")],
        "token_check_on": 1,
    },
    "jobset.yaml": {
        "file": "jobset.yaml",
        "kind": "JobSet",
        "pods": {
            0: dict(node_rank=0, nnodes="2", workers=2, backend="c10d", endpoint=JOBSET_ENDPOINT,
                    hosted=True, run_id="train-mlp-jobset", max_restarts=3, world=4, group_world=2,
                    origins={"node_rank": "JOB_COMPLETION_INDEX", "nnodes": "--nnodes",
                             "rdzv_endpoint": "--rdzv-endpoint", "rdzv_id": "--rdzv-id"}),
            1: dict(node_rank=1, nnodes="2", workers=2, backend="c10d", endpoint=JOBSET_ENDPOINT,
                    hosted=False, run_id="train-mlp-jobset", max_restarts=3, world=4, group_world=2,
                    origins={"node_rank": "JOB_COMPLETION_INDEX"}),
        },
        "broken_on": 1,
        "broken": [({"env": {"JOB_COMPLETION_INDEX": "-1"}}, "launch: JOB_COMPLETION_INDEX=-1: "),
                   ({"secret": "short"}, "launch: --rdzv-token-file=")],
    },
    "trainjob.yaml": {
        "file": "trainjob.yaml",
        "kind": "TrainJob",
        "pods": {
            0: dict(node_rank=0, nnodes="2", workers=2, backend="c10d", endpoint=TRAINJOB_ENDPOINT, hosted=True,
                    run_id="train-mlp-trainjob", max_restarts=3, world=4, group_world=2,
                    origins={"node_rank": "PET_NODE_RANK", "nnodes": "PET_NNODES",
                             "nproc_per_node": "PET_NPROC_PER_NODE", "rdzv_endpoint": "--rdzv-endpoint"},
                    absent=["master_addr", "master_port"]),
            1: dict(node_rank=1, nnodes="2", workers=2, backend="c10d", endpoint=TRAINJOB_ENDPOINT, hosted=False,
                    run_id="train-mlp-trainjob", max_restarts=3, world=4, group_world=2,
                    origins={"node_rank": "PET_NODE_RANK"}, absent=["master_addr", "master_port"]),
        },
        "broken_on": 1,
        "broken": [({"env": {"PET_NNODES": "0"}}, "launch: PET_NNODES=0: "),
                   ({"env": {"PET_NODE_RANK": "first"}}, "launch: PET_NODE_RANK=first: "),
                   ({"secret": "short"}, "launch: LAUNCH_RDZV_TOKEN: ")],
        "token_check_on": 1,
    },
}

# launch's warning for an endpoint whose name does not resolve yet (it joins it all the same).
NOT_YET = re.compile(r"^\[launch [0-9:.]+ W\] --rdzv-endpoint=\S+: .*\(yet\): joining it, retried until join_timeout$")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pods_of(docs, kind, transform=None):
    runtimes = {(d["kind"], d["metadata"]["name"]): d for d in docs
                if d.get("kind") in ("TrainingRuntime", "ClusterTrainingRuntime")}
    objs = [d for d in docs if d.get("kind") == kind]
    if len(objs) != 1:
        raise Failure(f"expected one {kind}, found {len(objs)}")
    obj = transform(objs[0]) if transform else objs[0]
    if kind == "PyTorchJob":
        return obj, pytorchjob_pods(obj)
    if kind == "JobSet":
        return obj, jobset_pods(obj)
    return obj, trainjob_pods(obj, runtimes)


def waits_for_a_name(pod_spec):
    """The init containers that wait for a host name (getent hosts, nslookup, host, dig)."""
    out = []
    for ic in pod_spec.get("initContainers", []):
        text = " ".join((ic.get("command") or []) + (ic.get("args") or []))
        if re.search(r"\b(getent\s+hosts|nslookup|dig|host)\s", text):
            out.append(ic.get("name", "?"))
    return out


def lint(name, obj, pods):
    """What the controllers need of the manifest, beyond the environment."""
    errors = []
    for pod in pods:
        c = pod.container
        argv = (c.get("command") or []) + (c.get("args") or [])
        if "/opt/launch/bin/train_mlp" not in argv:
            errors.append(f"{pod.name}: train_mlp (/opt/launch/bin/train_mlp, the image's) is not the program")
        if not c.get("image"):
            errors.append(f"{pod.name}: no image")
        # launch joins an endpoint whose name does not resolve yet: nothing has to wait for it
        # (and such a wait would only delay every pod but pod 0).
        waiting = waits_for_a_name(pod.pod_spec)
        if waiting:
            errors.append(f"{pod.name}: init container(s) {waiting} wait for a host name; launch needs none")
    if obj["kind"] == "PyTorchJob":
        e = obj["spec"].get("elasticPolicy") or {}
        n = obj["spec"]["pytorchReplicaSpecs"]["Worker"].get("replicas", 1)
        if not (e.get("minReplicas", n) <= n <= e.get("maxReplicas", n)):
            errors.append(f"{name}: Worker replicas {n} outside minReplicas..maxReplicas")
        if "Master" in obj["spec"]["pytorchReplicaSpecs"] and e:
            errors.append(f"{name}: a Master replica in an elastic job pins MASTER_ADDR to it")
    if obj["kind"] == "JobSet":
        # launch's --nnodes must be the Job's pod count, else the round waits for nodes never made.
        args = pods[0].container.get("args") or []
        nnodes = [a.split("=", 1)[1] for a in args if a.startswith("--nnodes=")]
        if nnodes and nnodes[0].split(":")[-1] != str(len(pods)):
            errors.append(f"{name}: --nnodes={nnodes[0]} but the JobSet makes {len(pods)} pods")
    return errors


def removed_by_prefix(argv):
    """The variables an `env -u NAME ...` before launch removes."""
    out = set()
    if argv and os.path.basename(argv[0]) == "env":
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            if argv[i] in ("-u", "--unset") and i + 1 < len(argv):
                out.add(argv[i + 1])
                i += 2
            elif argv[i].startswith("--unset="):
                out.add(argv[i].split("=", 1)[1])
                i += 1
            else:
                i += 1
    return out


def check_plan(pod, want, r, argv, pod_env, train_mlp, simulate, before_dns):
    """The dry run's plan against the contract; returns the list of what differs."""
    errs = []
    where = pod.name + (" (before DNS)" if before_dns else "")
    if r.returncode != 0:
        return [f"{where}: exit {r.returncode}, expected 0; stderr: {r.stderr.strip()}"]
    plan = Plan(r.stdout)
    h = plan.header
    if h is None:
        return [f"{where}: no 'launch --dry-run:' header in its output:\n{r.stdout}"]
    def eq(what, got, expected):
        if got != expected:
            errs.append(f"{where}: {what} is {got!r}, expected {expected!r}")
    eq("the node rank", int(h.group(1)), want["node_rank"])
    eq("the node count", h.group(2), want["nnodes"])
    eq("the workers on this node", int(h.group(3)), want["workers"])
    eq("the rendezvous endpoint", h.group(4), want["endpoint"])
    eq("the run id", h.group(6), want["run_id"])
    eq("the rendezvous backend", (plan.settings.get("rdzv_backend") or (None,))[0], want["backend"])
    not_yet = [l for l in r.stderr.splitlines() if NOT_YET.match(l)]
    if simulate:
        if want["endpoint"] is not None:
            eq("who hosts the coordinator", h.group(5), "hosted here" if want["hosted"] else "another host's")
        stray = [l for l in r.stderr.splitlines() if "a real run would stop here" in l]
        if stray:
            errs.append(f"{where}: {stray[0]}")
        # Before cluster DNS knows the endpoint, a pod that joins says so once and joins all the
        # same; the host knows its own name from /etc/hosts (or its host name), and with DNS nobody
        # warns.
        expect_warning = before_dns and want["endpoint"] is not None and not want["hosted"]
        eq("the 'does not resolve yet' warnings", len(not_yet), 1 if expect_warning else 0)
    elif len(not_yet) > 1:
        errs.append(f"{where}: {len(not_yet)} 'does not resolve yet' warnings, expected at most one")
    for key, origin in want.get("origins", {}).items():
        got = plan.settings.get(key)
        if got is None:
            errs.append(f"{where}: the dry run shows no '{key}' setting")
        else:
            eq(f"where {key} came from", got[1], origin)
    for key in want.get("absent", []):
        if key in plan.settings:
            value, origin = plan.settings[key]
            errs.append(f"{where}: '{key}' is set ({value}, from {origin}), expected unset")
    eq("the number of workers printed", len(plan.workers), want["workers"])
    # The program and its arguments, as the container gives them to launch.
    program = argv[argv.index(train_mlp):] if train_mlp in argv else []
    # The dry run prints what launch sets or changes; the worker gets the rest of launch's
    # environment (the pod's, less what an `env -u` before launch removes) as it is, less the token.
    inherited = {k: v for k, v in pod_env.items() if k not in removed_by_prefix(argv) and k != "LAUNCH_RDZV_TOKEN"}
    for i, w in enumerate(plan.workers):
        rank = want["node_rank"] * want["workers"] + i
        env = dict(inherited, **w["env"])
        eq(f"worker {i}'s rank", w["rank"], rank)
        eq(f"worker {i}'s local rank", w["local_rank"], i)
        expected_env = {"RANK": rank, "LOCAL_RANK": i, "GROUP_RANK": want["node_rank"], "ROLE_RANK": rank,
                        "WORLD_SIZE": want["world"], "ROLE_WORLD_SIZE": want["world"],
                        "LOCAL_WORLD_SIZE": want["workers"], "GROUP_WORLD_SIZE": want["group_world"],
                        "TORCHELASTIC_RUN_ID": want["run_id"], "TORCHELASTIC_MAX_RESTARTS": want["max_restarts"],
                        "TORCHELASTIC_RESTART_COUNT": 0}
        if "master" in want:
            expected_env["MASTER_ADDR"], expected_env["MASTER_PORT"] = want["master"]
        for k, v in expected_env.items():
            eq(f"worker {i}'s {k}", env.get(k), str(v))
        if "LAUNCH_RDZV_TOKEN" in w["env"]:
            errs.append(f"{where}: worker {i} is given LAUNCH_RDZV_TOKEN")
        eq(f"worker {i}'s argv", w["argv"], " ".join(program))
    return errs


def check_broken(pod, r, prefix):
    errs = []
    lines = [l for l in r.stderr.splitlines() if not l.startswith("[launch ")]
    if r.returncode != 2:
        errs.append(f"{pod.name}: exit {r.returncode}, expected 2; stderr: {r.stderr.strip()}")
    if len(lines) != 1 or not lines[0].startswith(prefix):
        errs.append(f"{pod.name}: expected one line starting {prefix!r} on stderr, got {lines!r}")
    if re.search(r"^rank \d+ \(local rank", r.stdout, re.M):
        errs.append(f"{pod.name}: a failed dry run printed workers")
    return errs


def check_pod(runner, manifest, pod, want, dns):
    """One pod's dry run against the contract, with cluster DNS answering the job's names and,
    where pods are simulated, again before it knows any; returns what differs."""
    env = container_env(pod, SECRETS)
    mounts = secret_files(pod, SECRETS, os.path.join(runner.tmp, pod.name))
    argv = runner.pod_argv(pod, env, mounts)
    errs = []
    for before_dns in ((False, True) if runner.simulate else (False,)):
        r = runner.run(pod, env, argv, {} if before_dns else dns)
        e = check_plan(pod, want, r, argv, env, runner.train_mlp, runner.simulate, before_dns)
        errs += e
        header = Plan(r.stdout).header
        when = " before DNS" if before_dns else ""
        print(f"{manifest}: {pod.name}{when}: {'ok' if not e else 'FAILED'}: "
              f"{header.group(0) if header else r.stderr.strip()}")
    return errs


def check_broken_pod(runner, manifest, pod, change, prefix, dns):
    """The pod with one value broken (an env variable, or the Secret's value): exit 2, one line."""
    secrets = dict(SECRETS)
    if "secret" in change:
        secrets[("launch-rdzv-token", "token")] = change["secret"]
    env = container_env(pod, secrets)
    env.update(change.get("env", {}))
    mounts = secret_files(pod, secrets, os.path.join(runner.tmp, "broken", pod.name))
    r = runner.run(pod, env, runner.pod_argv(pod, env, mounts), dns)
    errs = check_broken(pod, r, prefix)
    shown = [l for l in r.stderr.splitlines() if not l.startswith("[launch ")]
    print(f"{manifest}: {pod.name} with {change}: {'ok' if not errs else 'FAILED'}: "
          f"exit {r.returncode}: {shown[0] if shown else ''}")
    return errs


def check_token_kept(runner, manifest, pod):
    """A real single-node launch (--standalone, one worker) with the pod's environment and the
    command before launch (env -u ...): the worker gets the pod's environment but the token."""
    env = container_env(pod, SECRETS)
    token = env.get("LAUNCH_RDZV_TOKEN")
    if not token:
        raise Failure(f"{pod.name}: its container has no LAUNCH_RDZV_TOKEN for the token check")
    dump = os.path.join(runner.tmp, f"worker-env.{pod.name}")
    stub = os.path.join(runner.tmp, "dump_env")
    with open(stub, "w") as f:
        f.write(f"#!/bin/sh\nexec env > '{dump}'\n")
    os.chmod(stub, 0o755)
    c = pod.container
    argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
    at = [i for i, a in enumerate(argv) if a == "launch" or a.endswith("/launch")][0]
    argv = argv[:at] + [runner.launch, "--standalone", "--nnodes=1", "--node-rank=0", "--nproc-per-node=1",
                        "--rdzv-id=token-check", stub]
    command = ["env", "-i", "PATH=/usr/bin:/bin"] + [f"{k}={v}" for k, v in env.items()] + argv
    # The pod's ports (its PET_MASTER_PORT, 29400) are the pod's own: in a network namespace of its
    # own, a port another job holds on this machine does not fail the check.
    if net_namespace_works():
        command = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] + command
    try:
        r = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=runner.tmp)
    except subprocess.TimeoutExpired:
        raise Failure(f"{pod.name}: the token check's launch did not return within 60 s")
    errs = []
    if r.returncode != 0 or not os.path.exists(dump):
        errs.append(f"{pod.name}: the token check's launch exited {r.returncode} (worker env written: "
                    f"{os.path.exists(dump)}); stderr: {r.stderr.strip()}")
    else:
        with open(dump) as f:
            worker = dict(l.split("=", 1) for l in f.read().splitlines() if "=" in l)
        if "LAUNCH_RDZV_TOKEN" in worker or any(token in v for v in worker.values()):
            errs.append(f"{pod.name}: the worker's environment has the rendezvous token")
        missing = sorted(k for k in env if k != "LAUNCH_RDZV_TOKEN" and k not in removed_by_prefix(argv)
                         and k not in worker)
        if missing:
            errs.append(f"{pod.name}: the worker's environment lacks the pod's {missing}")
    print(f"{manifest}: {pod.name}: real launch, the token kept from the worker: {'ok' if not errs else 'FAILED'}")
    return errs


def check_manifest(runner, manifests, manifest, contract):
    try:
        docs = load(os.path.join(manifests, contract["file"]))
        obj, (pods, dns) = pods_of(docs, contract["kind"], contract.get("transform"))
    except (Failure, KeyError, TypeError, ValueError, OSError, yaml.YAMLError) as e:
        return [f"{manifest}: {e!r}"]
    errs = lint(manifest, obj, pods)
    # The job's other pods are elsewhere; the pod under test has this machine's address.
    peers = (ip for ip in ipaddress.ip_network("198.51.100.0/24").hosts() if str(ip) not in runner.local_ips)
    for pod in pods:
        pod.ip = str(next(peers))
    for index, want in contract["pods"].items():
        if index >= len(pods):
            errs.append(f"{manifest}: no pod {index} ({len(pods)} pods)")
            continue
        pod = pods[index]
        elsewhere, pod.ip = pod.ip, runner.self_ip
        try:
            errs += check_pod(runner, manifest, pod, want, dns)
            if index == contract["broken_on"]:
                for change, prefix in contract["broken"]:
                    errs += check_broken_pod(runner, manifest, pod, change, prefix, dns)
            if index == contract.get("token_check_on"):
                errs += check_token_kept(runner, manifest, pod)
        except Failure as e:
            errs.append(str(e))
        finally:
            pod.ip = elsewhere
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", required=True)
    ap.add_argument("--manifests", required=True)
    ap.add_argument("--train-mlp", default=None)
    ap.add_argument("--no-namespaces", action="store_true", help="run every pod as this machine (the fallback)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="k8s-manifests-")
    failures = []
    try:
        train_mlp = a.train_mlp
        if not train_mlp or not os.access(train_mlp, os.X_OK):
            # A build without LibTorch has no train_mlp: the dry run only needs an executable.
            train_mlp = os.path.join(tmp, "train_mlp")
            with open(train_mlp, "w") as f:
                f.write("#!/bin/sh\nexit 0\n")
            os.chmod(train_mlp, 0o755)
        runner = Runner(a.launch, os.path.abspath(train_mlp), tmp)
        runner.simulate = runner.simulate and not a.no_namespaces
        if runner.simulate:
            print(f"pods run with their own host name and /etc/hosts (this pod's address {runner.self_ip})")
        else:
            print("note: no mount/UTS namespaces here (needs root and unshare): every pod runs with this "
                  "machine's host name, so who hosts the coordinator is not checked")
        for manifest, contract in CONTRACT.items():
            failures += check_manifest(runner, a.manifests, manifest, contract)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("every manifest's pods get the plan their job needs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
