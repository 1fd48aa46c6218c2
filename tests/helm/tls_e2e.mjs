// The chart's TLS and auth values, end to end with a real etcd (issue 17, item 10):
//
//   node tls_e2e.mjs [VALUES_FILE]      (default helm/newt/ci/tls-values.yaml)
//
// renders the chart with the values file, then runs what the rendered pods would run, as
// they render it, on loopback:
//   1. the Secrets the values name, made in a temporary folder: a CA, etcd's server and peer
//      certificates, newt's client certificate (without a Common Name, as docs/kubernetes.md
//      asks), the etcd user's and root's passwords, the job secret;
//   2. each pod's volumes (Secrets, the spec ConfigMap, emptyDirs, PVCs) as folders, found
//      from the rendered volumes and volumeMounts: every path a pod's command line,
//      environment or script names under a mount path is rewritten to that folder, so a
//      path the chart does not mount stays unmounted and fails;
//   3. etcd with the rendered StatefulSet container's command and flags; substituted only:
//      host and port of its URLs (free loopback ports), the cluster (this one member) and,
//      through the mounts, the data dir and the certificate files. Ready when the rendered
//      startup probe answers;
//   4. the auth bootstrap Job's script (twice: it is idempotent) with its rendered
//      environment, then the helm test hook that asks etcd's health as the newt user;
//   5. a newt coordinator and a newt worker with the rendered Jobs' flags and environment
//      (etcd endpoints rewritten to the loopback port; ports to free ones; POD_IP a loopback
//      address per pod) on the rendered spec, shrunk (train.steps, batch, model size), while
//      the rendered `newt status --wait-workers` test hook runs; the job must train to its
//      end, every process exit 0, and `newt status` (with the rendered environment alone)
//      show it done;
//   6. what must be refused: a wrong password (an authentication error, not the CN one), a
//      plain-http client, a client without a certificate, an anonymous etcdctl, and a
//      client certificate with a Common Name (refused with newt's CN message: the two
//      mistakes read differently); and a second etcd, its server certificate without the
//      client auth usage: etcdctl works, the gateway and so newt do not.
// The processes run as this test's user: that the pods' user may read each Secret file
// (mode, fsGroup) is checked from the rendered pod specs.
// Environment (set by ctest): NEWT_HELM_TOOLS (bin/helm, node_modules), NEWT_BIN,
// NEWT_SOURCE_DIR. Needs etcd, etcdctl and openssl on PATH. Prints one line per check and
// closes with "N passed, N failed"; exits 1 when any check failed.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { createServer } from "node:net";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`tls_e2e.mjs: ${name} is not set (run it through ctest: ctest -R helm_tls_e2e)`);
    process.exit(2);
  }
  return v;
}
const src = process.env.NEWT_SOURCE_DIR || resolve(here, "../..");
const tools = need("NEWT_HELM_TOOLS");
const newtBin = need("NEWT_BIN");
const helmBin = join(tools, "bin/helm");
const chart = join(src, "helm/newt");
const valuesFile = resolve(process.argv[2] || join(chart, "ci/tls-values.yaml"));
const require = createRequire(join(tools, "package.json"));
const YAML = require("yaml");
const tmp = mkdtempSync(join(tmpdir(), "newt-tls-e2e-"));
const keep = !!process.env.NEWT_TEST_KEEP;

const NAMESPACE = "newt-ci";
const RELEASE = "ci";
const KUBE_VERSION = "1.30.0";
// The job, shrunk: what the rendered spec keeps besides these is run as rendered.
const STEPS = 16;
const SHRINK = { train: { steps: STEPS, global_batch: 8, micro_batch: 2, seq_len: 32 }, model: { layers: 2, channels: 64 }, ckpt: { every: 8 } };

// --- reporting ---------------------------------------------------------------------------
let passed = 0;
let failed = 0;
class Fatal extends Error {}
async function check(name, fn) {
  const errors = [];
  try {
    await fn(errors);
  } catch (e) {
    errors.push(e instanceof Fatal ? e.message : e.stack || String(e));
  }
  if (errors.length) {
    failed++;
    console.log(`FAIL  ${name}\n    ${errors.join("\n    ")}`);
  } else {
    passed++;
    console.log(`ok    ${name}`);
  }
  return errors.length === 0;
}

// --- processes ---------------------------------------------------------------------------
const children = new Set();
function cleanup() {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  if (!keep) rmSync(tmp, { recursive: true, force: true });
  else console.log(`kept ${tmp}`);
}
process.on("exit", cleanup);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(1));

function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", maxBuffer: 64 << 20, timeout: 120000, ...opts });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  return { code: r.status, out: r.stdout, err: r.stderr, all: `${r.stdout}${r.stderr}` };
}
// A long-running process with its output in LOG; .done resolves to its exit code.
function start(cmd, args, env, log) {
  const fd = openSync(log, "a");
  const c = spawn(cmd, args, { env, stdio: ["ignore", fd, fd] });
  closeSync(fd);
  children.add(c);
  c.done = new Promise((ok) => c.on("exit", (code, sig) => ok(code ?? `signal ${sig}`)));
  c.log = log;
  return c;
}
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));
async function within(p, ms) {
  let t;
  const r = await Promise.race([p, new Promise((ok) => (t = setTimeout(() => ok(undefined), ms)))]);
  clearTimeout(t);
  return r;
}
const tail = (file, n = 30) => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").slice(-n).join("\n      ") : "(no log)");
function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.on("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}
function httpGet(host, port, path) {
  return new Promise((ok) => {
    const req = request({ host, port, path, timeout: 3000 }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => ok({ status: res.statusCode, body }));
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", (e) => ok({ status: 0, body: e.message }));
    req.end();
  });
}

// --- the chart ---------------------------------------------------------------------------
function merge(base, over) {
  const isMap = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  if (!isMap(base) || !isMap(over)) return over === undefined ? base : structuredClone(over);
  const out = structuredClone(base);
  for (const [k, v] of Object.entries(over)) out[k] = k in out ? merge(out[k], v) : structuredClone(v);
  return out;
}
const component = (d) => d.metadata?.labels?.["app.kubernetes.io/component"];
const podSpecOf = (d) => (d.kind === "Pod" ? d.spec : d.spec?.template?.spec);

// --- the Secrets -------------------------------------------------------------------------
// cert-manager's layout (ca.crt, tls.crt, tls.key). etcd's server certificate has both
// usages: with --client-cert-auth, etcd's JSON gateway connects to etcd's own gRPC with
// it, as a client (docs/kubernetes.md); the peers do the same with theirs.
function makeCerts(dir) {
  const ssl = (...args) => {
    const r = run("openssl", args, { cwd: dir });
    if (r.code !== 0) throw new Fatal(`openssl ${args.join(" ")}: ${r.all}`);
  };
  ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=newt e2e CA");
  const leaf = (name, subj, ext) => {
    writeFileSync(join(dir, `${name}.ext`), ext);
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", subj);
    ssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", `${name}.crt`, "-days", "2", "-extfile", `${name}.ext`);
  };
  const serverExt = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n";
  leaf("server", "/CN=newt-etcd", serverExt);
  leaf("peer", "/CN=newt-etcd-peer", serverExt);
  leaf("server-only", "/CN=newt-etcd", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"); // the mistake
  leaf("client", "/O=newt", "extendedKeyUsage=clientAuth\n"); // no Common Name
  leaf("client-cn", "/O=newt/CN=newt", "extendedKeyUsage=clientAuth\n"); // the mistake
  const f = (n) => readFileSync(join(dir, n), "utf8");
  const tls = (name) => ({ "ca.crt": f("ca.crt"), "tls.crt": f(`${name}.crt`), "tls.key": f(`${name}.key`) });
  return { server: tls("server"), serverOnly: tls("server-only"), peer: tls("peer"), client: tls("client"), clientCN: tls("client-cn") };
}
function makeSecrets(values, certs) {
  const s = {};
  const a = values.etcdClient.auth;
  if (values.etcd.tls?.serverSecret) s[values.etcd.tls.serverSecret] = certs.server;
  if (values.etcd.tls?.peerSecret) s[values.etcd.tls.peerSecret] = certs.peer;
  if (values.etcdClient.tls?.secret) s[values.etcdClient.tls.secret] = certs.client;
  if (a?.secret) s[a.secret] = { [a.usernameKey]: "newt", [a.passwordKey]: randomBytes(16).toString("hex") };
  if (a?.bootstrap?.rootSecret) s[a.bootstrap.rootSecret] = { [a.passwordKey]: randomBytes(16).toString("hex") };
  if (values.jobSecret?.secret) s[values.jobSecret.secret] = { [values.jobSecret.key]: randomBytes(24).toString("hex") };
  return s;
}

// --- a rendered container, run on this host ------------------------------------------------
// POD_IP: a loopback address per pod (127.0.1.N), as every pod has its own; ports: each
// containerPort to a free one; volumes: folders; etcd endpoints: the loopback etcd.
let podCount = 0;
class Host {
  constructor(root, secrets, configMaps) {
    this.root = root;
    mkdirSync(root, { recursive: true });
    this.secrets = secrets;
    this.configMaps = configMaps;
    this.endpointRewrites = []; // [rendered host:port, loopback host:port]
  }
  // The folder of one volume of a pod.
  volumeDir(pod, vol) {
    if (vol.persistentVolumeClaim) {
      const d = join(this.root, "pvc", vol.persistentVolumeClaim.claimName);
      mkdirSync(d, { recursive: true });
      return d;
    }
    const d = join(this.root, "pods", pod.name, vol.name);
    if (existsSync(d)) return d;
    mkdirSync(d, { recursive: true });
    const files = (data, items, mode, what) => {
      for (const { key, path, mode: m } of items || Object.keys(data).map((key) => ({ key, path: key }))) {
        if (!(key in data)) throw new Fatal(`${pod.where}: volume ${vol.name}: ${what} has no key ${key}`);
        mkdirSync(dirname(join(d, path)), { recursive: true });
        writeFileSync(join(d, path), data[key]);
        chmodSync(join(d, path), (m ?? mode ?? 0o644) | 0o400); // | 0o400: this test's user reads it
      }
    };
    if (vol.secret) {
      const data = this.secrets[vol.secret.secretName];
      if (!data) throw new Fatal(`${pod.where}: volume ${vol.name} mounts Secret ${vol.secret.secretName}, which the values do not name`);
      files(data, vol.secret.items, vol.secret.defaultMode, `Secret ${vol.secret.secretName}`);
    } else if (vol.configMap) {
      const data = this.configMaps[vol.configMap.name];
      if (!data) throw new Fatal(`${pod.where}: volume ${vol.name} mounts ConfigMap ${vol.configMap.name}, which is not rendered`);
      files(data, vol.configMap.items, vol.configMap.defaultMode, `ConfigMap ${vol.configMap.name}`);
    } else if (!vol.emptyDir) throw new Fatal(`${pod.where}: volume ${vol.name}: unexpected kind ${Object.keys(vol)}`);
    return d;
  }
  // A pod of workload DOC (named NAME, or after DOC), its container CONTAINERNAME (or the
  // first): the command, args and env as Kubernetes would give them, with this host's
  // substitutions.
  async pod(doc, { name, containerName } = {}) {
    const spec = podSpecOf(doc);
    const c = containerName ? spec.containers.find((x) => x.name === containerName) : spec.containers[0];
    const n = ++podCount;
    const pod = { name: name || `${doc.metadata.name}-${n}`, ip: `127.0.1.${n}`, where: `${doc.kind}/${doc.metadata.name}`, c, doc };
    // volumes and mounts
    const claims = Object.fromEntries((doc.spec.volumeClaimTemplates || []).map((t) => [t.metadata.name, { name: t.metadata.name, persistentVolumeClaim: { claimName: `${t.metadata.name}-${pod.name}` } }]));
    pod.mounts = [];
    for (const m of c.volumeMounts || []) {
      const vol = (spec.volumes || []).find((v) => v.name === m.name) || claims[m.name];
      if (!vol) throw new Fatal(`${pod.where}: volumeMount ${m.name} has no volume`);
      let dir = this.volumeDir(pod, vol);
      if (m.subPath) mkdirSync((dir = join(dir, m.subPath)), { recursive: true });
      pod.mounts.push({ path: m.mountPath.replace(/\/+$/, ""), dir });
    }
    pod.mounts.sort((x, y) => y.path.length - x.path.length);
    // ports
    pod.ports = {};
    pod.portByName = {};
    for (const p of c.ports || []) {
      pod.ports[p.containerPort] = await freePort();
      if (p.name) pod.portByName[p.name] = pod.ports[p.containerPort];
    }
    // environment, in order, with $(VAR) references to the ones before
    const env = {};
    for (const e of c.env || []) {
      let v;
      if ("value" in e) v = expand(String(e.value), env);
      else if (e.valueFrom?.fieldRef) {
        const f = e.valueFrom.fieldRef.fieldPath;
        // one simulated node holds every pod (the workers' failure domain: spec.nodeName)
        v = { "metadata.name": pod.name, "metadata.namespace": NAMESPACE, "status.podIP": pod.ip, "spec.nodeName": "ci-node-0" }[f];
        if (v === undefined) throw new Fatal(`${pod.where}: env ${e.name}: fieldRef ${f} is not simulated`);
      } else if (e.valueFrom?.secretKeyRef) {
        const { name: sn, key } = e.valueFrom.secretKeyRef;
        v = this.secrets[sn]?.[key];
        if (v === undefined) throw new Fatal(`${pod.where}: env ${e.name}: Secret ${sn} key ${key}, which the values do not name`);
      } else throw new Fatal(`${pod.where}: env ${e.name}: unexpected ${JSON.stringify(e)}`);
      env[e.name] = v;
    }
    const cmd = (c.command || []).map((t) => expand(t, env));
    const args = (c.args || []).map((t) => expand(t, env));
    pod.env = Object.fromEntries(Object.entries(env).map(([k, v]) => [k, this.rewrite(pod, v)]));
    pod.argv = [...cmd, ...args].map((t, i) => (i === 0 ? t : this.rewrite(pod, t)));
    if (keep) writeFileSync(join(this.root, `${pod.name}.json`), JSON.stringify({ argv: pod.argv, env: pod.env, mounts: pod.mounts, ports: pod.ports }, null, 2));
    return pod;
  }
  // One string of a pod: a path under a mount to its folder (also inside a script), a
  // rendered etcd endpoint to the loopback one, a --flag=<containerPort> to its free port.
  rewrite(pod, s) {
    // one pass, longest mount path first: a folder already substituted is not rewritten again
    if (pod.mounts.length) {
      const re = new RegExp(`(?<![\\w./-])(${pod.mounts.map((m) => escapeRe(m.path)).join("|")})(?=/|$|[\\s"',:;)])`, "g");
      s = s.replace(re, (mp) => pod.mounts.find((m) => m.path === mp).dir);
    }
    for (const [from, to] of this.endpointRewrites) s = s.split(from).join(to);
    s = s.replace(/^(--[a-z-]*port=)(\d+)$/, (all, f, p) => (pod.ports[p] ? `${f}${pod.ports[p]}` : all));
    // a list of endpoints that now names one etcd several times names it once
    if (/^(--[a-z-]+=)?https?:\/\/[^,]+(,https?:\/\/[^,]+)+$/.test(s)) {
      const [, flag = ""] = s.match(/^(--[a-z-]+=)?/);
      s = flag + [...new Set(s.slice(flag.length).split(","))].join(",");
    }
    return s;
  }
  // Member 0 of the rendered etcd StatefulSet, alone: its flags as rendered but for the
  // host and port of its URLs (loopback, free ports) and the cluster (itself); the files
  // through its mounts. Every member's rendered client endpoint is this etcd from now on.
  // Resolves once the rendered startup probe answers.
  async startEtcd(sts, errors) {
    const pod = await this.pod(sts, { name: `${sts.metadata.name}-0` });
    const client = pod.c.ports?.find((p) => p.name === "client")?.containerPort;
    if (!client) throw new Fatal("the etcd container has no port named client");
    const adv = flagValue([...(pod.c.command || []), ...(pod.c.args || [])], "--advertise-client-urls"); // as rendered: $(POD_NAME)
    if (!adv) throw new Fatal("etcd has no --advertise-client-urls");
    for (let i = 0; i < sts.spec.replicas; i++) {
      const u = new URL(expand(adv.split(",")[0], { POD_NAME: `${sts.metadata.name}-${i}` }));
      this.endpointRewrites.push([u.host, `127.0.0.1:${pod.ports[client]}`]);
    }
    const argv = [pod.argv[0]];
    const name = flagValue(pod.argv, "--name");
    for (const a of pod.argv.slice(1)) {
      const m = a.match(/^(--[a-z-]+)=(.*)$/);
      if (!m) throw new Fatal(`etcd argument ${a} is not --flag=value`);
      let [, f, v] = m;
      if (f === "--initial-cluster") {
        const mine = v.split(",").find((e) => e.startsWith(`${name}=`));
        if (!mine) errors.push(`--initial-cluster ${v} has no member ${name}`);
        v = mine || v;
      }
      // URLs: the host to loopback, the container port to its free port
      v = v.replace(/(https?):\/\/([^,:/]+):(\d+)/g, (all, scheme, h, port) => (pod.ports[port] ? `${scheme}://127.0.0.1:${pod.ports[port]}` : all));
      argv.push(`${f}=${v}`);
    }
    if (errors.length) throw new Fatal("etcd not started");
    const proc = start(argv[0], argv.slice(1), this.processEnv(pod), join(this.root, "etcd.log"));
    const probe = pod.c.startupProbe?.httpGet;
    if (!probe) throw new Fatal("etcd has no httpGet startupProbe");
    const port = pod.portByName[probe.port] ?? pod.ports[probe.port];
    const deadline = Date.now() + 30000;
    for (let r; (r = await httpGet("127.0.0.1", port, probe.path)).status !== 200; await sleep(200)) {
      if (proc.exitCode !== null || Date.now() > deadline)
        throw new Fatal(`etcd's startup probe ${probe.path} on port ${probe.port}: ${r.status} ${r.body}\n      ${tail(proc.log)}`);
    }
    return { proc, loopback: flagValue(argv, "--advertise-client-urls") };
  }
  processEnv(pod, extra = {}) {
    const env = { PATH: process.env.PATH, HOME: join(tmp, "home"), ...pod.env, ...extra };
    for (const k of Object.keys(env)) if (env[k] === undefined) delete env[k];
    return env;
  }
  // The command to run: /usr/local/bin/newt (the image's) is the newt under test.
  exe(pod) {
    return pod.argv[0] === "/usr/local/bin/newt" ? newtBin : pod.argv[0];
  }
  start(pod, log, envExtra) {
    return start(this.exe(pod), pod.argv.slice(1), this.processEnv(pod, envExtra), join(this.root, `${log}.log`));
  }
}
function expand(s, env) {
  return s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (all, name) => (all === "$$" ? "$" : name in env ? env[name] : all));
}
const escapeRe = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
const flagValue = (argv, flag) => argv.find((a) => a.startsWith(`${flag}=`))?.slice(flag.length + 1);

// --- the test ----------------------------------------------------------------------------
async function main() {
  console.log(`values: ${valuesFile}`);
  const values = merge(YAML.parse(readFileSync(join(chart, "values.yaml"), "utf8")), YAML.parse(readFileSync(valuesFile, "utf8")) ?? {});
  let docs;
  const ok = await check("helm template renders the chart with the values", () => {
    const r = run(helmBin, ["template", RELEASE, chart, "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, "-f", valuesFile]);
    if (r.code !== 0) throw new Fatal(r.err);
    // YAML 1.1, as Kubernetes reads it: defaultMode 0440 is octal
    docs = YAML.parseAllDocuments(r.out, { version: "1.1" }).map((d) => d.toJS()).filter(Boolean);
  });
  if (!ok) return;
  const sts = docs.find((d) => d.kind === "StatefulSet" && component(d) === "etcd");
  const authJob = docs.find((d) => d.kind === "Job" && component(d) === "etcd-auth");
  const coordJob = docs.find((d) => d.kind === "Job" && component(d) === "coordinator");
  const workersJob = docs.find((d) => d.kind === "Job" && component(d) === "worker");
  const hooks = docs.filter((d) => d.kind === "Pod" && d.metadata.annotations?.["helm.sh/hook"] === "test");
  const etcdHook = hooks.find((d) => d.spec.containers[0].command?.[0] === "etcdctl");
  const statusHook = hooks.find((d) => d.spec.containers[0].args?.[0] === "status");
  if (!(await check("the values render an in-chart etcd with TLS and auth, its bootstrap Job, coordinators, workers and the test hooks", (errors) => {
    for (const [what, d] of Object.entries({ "etcd StatefulSet": sts, "auth bootstrap Job": authJob, "coordinator Job": coordJob, "workers Job": workersJob, "etcd health hook": etcdHook, "newt status hook": statusHook }))
      if (!d) errors.push(`no ${what}`);
    if (!values.etcdClient.tls.enabled || !values.etcdClient.auth.enabled) errors.push(`${valuesFile} does not turn on TLS and auth`);
  }))) return;

  // 1. Secrets and ConfigMaps
  const certDir = join(tmp, "certs");
  mkdirSync(certDir);
  mkdirSync(join(tmp, "home"));
  let certs, secrets;
  if (!(await check("openssl makes the CA and the certificates; the Secrets the values name", (errors) => {
    certs = makeCerts(certDir);
    secrets = makeSecrets(values, certs);
    const named = new Set();
    for (const d of docs) {
      const spec = podSpecOf(d);
      if (!spec?.containers) continue;
      for (const v of spec.volumes || []) if (v.secret) named.add(v.secret.secretName);
      for (const c of spec.containers) for (const e of c.env || []) if (e.valueFrom?.secretKeyRef) named.add(e.valueFrom.secretKeyRef.name);
    }
    for (const n of named) if (!secrets[n]) errors.push(`the chart uses Secret ${n}, which the values do not name`);
  }))) return;
  // The processes here run as this host's user; in the cluster they run as the pods' user,
  // and a Secret's files are root's, of group fsGroup, with the volume's mode.
  await check("every Secret file a container mounts is readable by the container's user (mode, fsGroup)", (errors) => {
    for (const d of docs) {
      const spec = podSpecOf(d);
      if (!spec?.containers) continue;
      for (const c of spec.containers) {
        const sc = { ...spec.securityContext, ...c.securityContext };
        if (sc.runAsUser === 0 || (sc.runAsUser === undefined && !sc.runAsNonRoot)) continue;
        for (const m of c.volumeMounts || []) {
          const v = (spec.volumes || []).find((x) => x.name === m.name)?.secret;
          if (!v) continue;
          for (const mode of [v.defaultMode ?? 0o644, ...(v.items || []).map((i) => i.mode).filter((x) => x !== undefined)])
            if (!(mode & 0o004) && !(spec.securityContext?.fsGroup !== undefined && mode & 0o040))
              errors.push(`${d.kind}/${d.metadata.name}/${c.name}: Secret ${v.secretName} at ${m.mountPath}: mode ${mode.toString(8)} is not readable by user ${sc.runAsUser} (fsGroup ${spec.securityContext?.fsGroup})`);
        }
      }
    }
  });
  const configMaps = Object.fromEntries(docs.filter((d) => d.kind === "ConfigMap").map((d) => [d.metadata.name, { ...d.data }]));
  const host = new Host(tmp, secrets, configMaps);

  // 2-3. etcd as the StatefulSet runs member 0, alone
  let etcd, loopback; // loopback: scheme://127.0.0.1:port of etcd's clients
  if (!(await check("etcd starts with the StatefulSet's flags (URLs to loopback ports, one member, the files from the mounts) and its startup probe answers", async (errors) => {
    ({ proc: etcd, loopback } = await host.startEtcd(sts, errors));
    console.log(`      etcd ${etcd.spawnargs.slice(1).join(" ").replaceAll(tmp, "$TMP")}`);
  }))) return;

  // 4. the auth bootstrap Job, then the etcd health hook as the newt user
  const authPod = await host.pod(authJob);
  if (!(await check("the auth bootstrap Job's script, with its rendered environment, turns on authentication (run twice)", async (errors) => {
    if (authPod.argv[0] !== "/bin/sh") throw new Fatal(`the bootstrap Job runs ${authPod.argv[0]}, not /bin/sh`);
    for (const attempt of ["first", "second"]) {
      const r = run(authPod.argv[0], authPod.argv.slice(1), { env: host.processEnv(authPod), timeout: 120000 });
      if (r.code !== 0) errors.push(`${attempt} run exited ${r.code}: ${r.all.trim()}`);
      else console.log(`      ${r.out.trim().replaceAll("\n", "\n      ")}`);
    }
  }))) return;
  const user = secrets[values.etcdClient.auth.secret][values.etcdClient.auth.usernameKey];
  const job = authPod.env.NEWT_JOB;
  await check("etcdctl as the Job's environment: anonymous refused, the newt user confined to /newt/<job>/", (errors) => {
    const pw = secrets[values.etcdClient.auth.secret][values.etcdClient.auth.passwordKey];
    const ctl = (...a) => run("etcdctl", ["--dial-timeout=3s", "--command-timeout=5s", ...a], { env: host.processEnv(authPod) });
    if (ctl("get", `/newt/${job}/x`).code === 0) errors.push("an anonymous get succeeded");
    if (ctl("--user", `${user}:${pw}`, "put", `/newt/${job}/probe`, "v").code !== 0) errors.push(`the newt user cannot write /newt/${job}/`);
    if (ctl("--user", `${user}:${pw}`, "put", "/elsewhere", "v").code === 0) errors.push("the newt user can write outside /newt/<job>/");
    ctl("--user", `${user}:${pw}`, "del", `/newt/${job}/probe`);
  });
  const etcdHookPod = await host.pod(etcdHook);
  await check("the etcd health test hook (etcdctl as the newt user, over mTLS) passes", () => {
    const r = run(etcdHookPod.argv[0], etcdHookPod.argv.slice(1), { env: host.processEnv(etcdHookPod), timeout: 60000 });
    if (r.code !== 0) throw new Fatal(`exit ${r.code}: ${r.all.trim()}`);
  });

  // 5. the job: the spec ConfigMap shrunk, a coordinator, a worker, the status hook
  const coordPod0 = podSpecOf(coordJob).containers[0];
  const specArg = flagValue([...(coordPod0.command || []), ...(coordPod0.args || [])], "--spec");
  const specMount = (coordPod0.volumeMounts || []).find((m) => specArg?.startsWith(`${m.mountPath}/`));
  const specVol = podSpecOf(coordJob).volumes.find((v) => v.name === specMount?.name);
  const specKey = specArg?.slice(specMount?.mountPath.length + 1);
  let coord, worker, statusHookProc, workerPod, coordPod, statusPod;
  const trained = await check(`a coordinator and a worker with the rendered Jobs' flags and environment train the job (${STEPS} steps) to its end`, async (errors) => {
    if (!specVol?.configMap || !configMaps[specVol.configMap.name]?.[specKey]) throw new Fatal(`the coordinator's --spec ${specArg} is not a rendered ConfigMap`);
    workerPod = await host.pod(workersJob);
    const spec = merge(JSON.parse(configMaps[specVol.configMap.name][specKey]), SHRINK);
    if (spec.ckpt?.dir) {
      const d = host.rewrite(workerPod, spec.ckpt.dir);
      if (d === spec.ckpt.dir) errors.push(`spec.ckpt.dir ${d} is on no volume of the workers`);
      spec.ckpt.dir = d;
    }
    configMaps[specVol.configMap.name][specKey] = JSON.stringify(spec, null, 2);
    coordPod = await host.pod(coordJob);
    statusPod = await host.pod(statusHook);
    for (const p of [coordPod, workerPod, statusPod])
      console.log(`      ${p.where}: newt ${p.argv.slice(1).join(" ").replaceAll(tmp, "$TMP")}`);
    coord = host.start(coordPod, "coordinator");
    statusHookProc = host.start(statusPod, "status-hook");
    worker = host.start(workerPod, "worker");
    const w = await within(worker.done, 240000);
    if (w !== 0) errors.push(`the worker ${w === undefined ? "did not end in 240 s" : `exited ${w}`}:\n      ${tail(worker.log)}`);
    const c = await within(coord.done, 30000);
    if (c !== 0) errors.push(`the coordinator ${c === undefined ? "did not end" : `exited ${c}`}:\n      ${tail(coord.log)}`);
  });
  await check("the `newt status --wait-workers` test hook saw the worker", async (errors) => {
    if (!statusHookProc) throw new Fatal("not run");
    const s = await within(statusHookProc.done, trained ? 30000 : 1000);
    if (s !== 0) errors.push(`${s === undefined ? "still waiting" : `exit ${s}`}:\n      ${tail(statusHookProc.log)}`);
  });
  if (!statusPod) return;
  // `newt status` in a newt container: the rendered environment only (kubectl exec)
  const status = (extraEnv = {}, flags = []) => run(newtBin, ["status", "--json", ...flags], { env: host.processEnv(statusPod, extraEnv), timeout: 60000 });
  await check("`newt status` with the rendered environment shows the job done at its last step", (errors) => {
    const r = status();
    if (r.code !== 0) throw new Fatal(`exit ${r.code}: ${r.all}`);
    const j = JSON.parse(r.out.trim().split("\n").pop());
    if (j.done?.step !== STEPS) errors.push(`not done at step ${STEPS}: ${r.out}`);
    else console.log(`      done: ${JSON.stringify(j.done)}`);
  });

  // 6. what must be refused
  const pwFile = statusPod.env.NEWT_ETCD_PASSWORD_FILE;
  const wrong = join(tmp, "wrong-password");
  writeFileSync(wrong, "not-the-password\n");
  const clientCN = join(tmp, "client-cn");
  mkdirSync(clientCN);
  writeFileSync(join(clientCN, "tls.crt"), certs.clientCN["tls.crt"]);
  writeFileSync(join(clientCN, "tls.key"), certs.clientCN["tls.key"], { mode: 0o600 });
  await check("a wrong password is refused as an authentication failure (not the Common Name message)", (errors) => {
    if (!pwFile) throw new Fatal("the rendered environment has no NEWT_ETCD_PASSWORD_FILE");
    const r = status({ NEWT_ETCD_PASSWORD_FILE: wrong });
    if (r.code === 0) errors.push("accepted");
    if (!/authentication failed/i.test(r.all) || /Common Name/i.test(r.all)) errors.push(`the error does not say authentication: ${r.all.trim()}`);
    else console.log(`      ${r.all.trim()}`);
  });
  await check("a plain-http client is refused", async (errors) => {
    const http = statusPod.env.NEWT_ETCD.replaceAll("https://", "http://");
    if (http === statusPod.env.NEWT_ETCD) throw new Fatal(`the rendered endpoints are not https: ${http}`);
    const r = status({ NEWT_ETCD: http });
    if (r.code === 0) errors.push(`newt status over ${http} succeeded: ${r.out}`);
    else console.log(`      ${r.all.trim()}`);
    const u = new URL(loopback);
    const g = await httpGet(u.hostname, u.port, "/version");
    if (g.status === 200) errors.push(`GET http://${u.host}/version answered 200: ${g.body}`);
  });
  await check("a client without a certificate is refused (the chart's etcd requires client certificates)", (errors) => {
    if (!statusPod.env.NEWT_ETCD_CERT) return console.log("      (the values use no client certificate: skipped)");
    const r = status({ NEWT_ETCD_CERT: undefined, NEWT_ETCD_KEY: undefined });
    if (r.code === 0) errors.push(`accepted: ${r.out}`);
    else console.log(`      ${r.all.trim()}`);
  });
  await check("a client certificate with a Common Name is refused with newt's CN message, unlike a wrong password", (errors) => {
    if (!statusPod.env.NEWT_ETCD_CERT) return console.log("      (the values use no client certificate: skipped)");
    const r = status({ NEWT_ETCD_CERT: join(clientCN, "tls.crt"), NEWT_ETCD_KEY: join(clientCN, "tls.key") });
    if (r.code === 0) errors.push(`accepted: ${r.out}`);
    if (!/Common Name/.test(r.all) || /authentication failed/i.test(r.all)) errors.push(`the error does not name the Common Name: ${r.all.trim()}`);
    else console.log(`      ${r.all.trim()}`);
  });
  etcd.kill("SIGTERM");
  await within(etcd.done, 10000);

  // The server certificate's usages: with --client-cert-auth, etcd's gateway dials etcd's
  // own gRPC presenting the server certificate, so without the client auth usage etcdctl
  // (gRPC) works and every gateway request, hence newt, fails.
  await check("etcd's server certificate needs the client auth usage too: without it the gateway fails while etcdctl works", async (errors) => {
    if (flagValue(etcd.spawnargs, "--client-cert-auth") !== "true") return console.log("      (no --client-cert-auth: skipped)");
    const bad = { ...secrets, [values.etcd.tls.serverSecret]: certs.serverOnly };
    const h = new Host(join(tmp, "server-auth-only"), bad, configMaps);
    const { proc } = await h.startEtcd(sts, errors);
    try {
      const ctlPod = await h.pod(authJob);
      const ctl = run("etcdctl", ["--dial-timeout=3s", "--command-timeout=5s", "endpoint", "health"], { env: h.processEnv(ctlPod) });
      if (ctl.code !== 0) errors.push(`etcdctl endpoint health failed too: ${ctl.all.trim()}`);
      const p = await h.pod(statusHook);
      const r = run(newtBin, ["status", "--json"], { env: h.processEnv(p), timeout: 60000 });
      if (r.code === 0) errors.push(`newt status succeeded: ${r.out}`);
      else if (!r.all.includes("server certificate needs the client auth usage"))
        errors.push(`newt's error does not name the server certificate's missing usage: ${r.all.trim()}`);
      else console.log(`      ${r.all.trim()}`);
    } finally {
      proc.kill("SIGKILL");
    }
  });
}

await main().catch((e) => {
  failed++;
  console.log(`FAIL  ${e.stack || e}`);
});
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
