// The checks of the Helm chart helm/newt, run by ctest (tests/helm/CMakeLists.txt):
//
//   node check.mjs lint     helm lint --strict (defaults and every ci/*-values.yaml);
//                           yamllint on the chart's own YAML and these tests' YAML
//   node check.mjs render   renders the chart with the defaults and every ci/*-values.yaml
//                           and checks each object: against the Kubernetes API schemas
//                           (kubernetes-models, loaded as ES modules) plus an unknown-field
//                           check built from the same models' type declarations; Chaos Mesh
//                           objects against schemas/chaos-mesh.json (ajv); yamllint on the
//                           output; every newt command line against `newt <cmd> --list-flags`
//                           of the built binary, etcd's against `etcd --help`, etcdctl's
//                           against `etcdctl ... --help`; the rendered job spec with newt's
//                           own parser (helm_spec_check); and the wiring a schema cannot see
//                           (selectors, volumes, ports, DNS names, security settings, the
//                           coordinators' --metrics-linger-ms); a program of the user's
//                           (workers.command, workers.image) run as `newt worker <the same
//                           args> -- <command>` on CPU and GPU pods.
//   node check.mjs reject   every case of reject.yaml must make `helm template` fail with
//                           its expected message.
//   node check.mjs rules    the PrometheusRule under `promtool test rules` (rules_test.yaml:
//                           a total outage, a healthy job, one done, one failed), and every
//                           rule's selectors carry the labels the ServiceMonitors' scrapes get.
//
// Environment (set by ctest): NEWT_HELM_TOOLS (setup.sh's cache: bin/helm, node_modules),
// NEWT_BIN, HELM_SPEC_CHECK, NEWT_SOURCE_DIR. Prints one line per check and closes with
// "N passed, N failed"; exits 1 when any check failed.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`check.mjs: ${name} is not set (run it through ctest: ctest -L helm)`);
    process.exit(2);
  }
  return v;
}
const src = process.env.NEWT_SOURCE_DIR || resolve(here, "../..");
const tools = need("NEWT_HELM_TOOLS");
const nm = join(tools, "node_modules");
const helmBin = join(tools, "bin/helm");
const chart = join(src, "helm/newt");
const yamllintConfig = join(here, "yamllint.yaml");
const require = createRequire(join(tools, "package.json"));
const YAML = require("yaml");
const Ajv = require("ajv");
const tmp = mkdtempSync(join(tmpdir(), "newt-helm-"));
process.on("exit", () => rmSync(tmp, { recursive: true, force: true }));

const NAMESPACE = "newt-ci";
const RELEASE = "ci";
const KUBE_VERSION = "1.30.0";

// --- reporting ---------------------------------------------------------------------------
let passed = 0;
let failed = 0;
async function check(name, fn) {
  try {
    const errors = [];
    await fn(errors);
    if (errors.length) throw new Error(errors.join("\n    "));
    passed++;
    console.log(`ok    ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL  ${name}\n    ${e.message}`);
  }
}
function finish() {
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

// --- tools -------------------------------------------------------------------------------
function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", maxBuffer: 64 << 20, ...opts });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  return { code: r.status, out: r.stdout, err: r.stderr };
}
function helm(args) {
  return run(helmBin, args);
}
function template(valueFiles) {
  const args = ["template", RELEASE, chart, "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION];
  for (const f of valueFiles) args.push("-f", f);
  return helm(args);
}
function yamllint(files) {
  const r = run("yamllint", ["-s", "-f", "parsable", "-c", yamllintConfig, ...files]);
  return r.code === 0 ? [] : [(r.out + r.err).trim()];
}
const ciValueFiles = () =>
  readdirSync(join(chart, "ci"))
    .filter((f) => f.endsWith("-values.yaml"))
    .sort()
    .map((f) => join(chart, "ci", f));

// Helm's merge of value files: maps merge, everything else is replaced.
function merge(base, over) {
  if (!isMap(base) || !isMap(over)) return over === undefined ? base : structuredClone(over);
  const out = structuredClone(base);
  for (const [k, v] of Object.entries(over)) out[k] = k in out ? merge(out[k], v) : structuredClone(v);
  return out;
}
// JSON with sorted keys, to compare objects whatever their key order.
const canonical = (v) => JSON.stringify(v, (k, x) => (isMap(x) ? Object.fromEntries(Object.entries(x).sort()) : x));
const isMap = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const loadYaml = (file) => YAML.parse(readFileSync(file, "utf8")) ?? {};

// --- Kubernetes API schemas (kubernetes-models) --------------------------------------------
function modelFile(apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/"))
    return join(nm, "@kubernetes-models/prometheus-operator", apiVersion, `${kind}.mjs`);
  return join(nm, "kubernetes-models", apiVersion, `${kind}.mjs`);
}
const modelCache = new Map();
async function model(apiVersion, kind) {
  const file = modelFile(apiVersion, kind);
  if (!modelCache.has(file)) {
    if (!existsSync(file)) modelCache.set(file, null);
    else modelCache.set(file, { Model: (await import(pathToFileURL(file).href))[kind], dts: file.replace(/\.mjs$/, ".d.ts") });
  }
  return modelCache.get(file);
}

// The generated validators accept unknown fields (the OpenAPI documents do not forbid
// them), while the API server rejects or drops them. The field names of every type are
// read from the models' own declarations (.d.ts, generated from the same OpenAPI), and
// any field that is not one of them is an error, at any depth.
const ifaceCache = new Map();
function iface(dtsFile) {
  if (ifaceCache.has(dtsFile)) return ifaceCache.get(dtsFile);
  if (!existsSync(dtsFile)) throw new Error(`type declarations not found: ${dtsFile}`);
  const text = readFileSync(dtsFile, "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ ([^}]+) \} from "([^"]+)";/g))
    for (const name of m[1].split(",")) imports.set(name.trim(), m[2]);
  const head = /export interface \w+(?: extends [\w, ]+)? \{/.exec(text);
  let result = null; // a type alias (IntOrString, Quantity, ...): a leaf
  if (head) {
    let i = head.index + head[0].length;
    let depth = 1;
    const start = i;
    while (depth > 0) {
      if (text[i] === "{") depth++;
      else if (text[i] === "}") depth--;
      i++;
    }
    result = { file: dtsFile, imports, props: parseProps(text.slice(start, i - 1)) };
  }
  ifaceCache.set(dtsFile, result);
  return result;
}
function parseProps(body) {
  const props = new Map();
  const re = /\s*"([^"]+)"\??:\s*/y;
  let i = 0;
  while (i < body.length) {
    re.lastIndex = i;
    const m = re.exec(body);
    if (!m) {
      i++;
      continue;
    }
    i = re.lastIndex;
    const start = i;
    let depth = 0;
    while (i < body.length && !(depth === 0 && body[i] === ";")) {
      if ("{<([".includes(body[i])) depth++;
      else if ("}>)]".includes(body[i])) depth--;
      i++;
    }
    props.set(m[1], body.slice(start, i).trim());
    i++;
  }
  return props;
}
function resolveType(from, name) {
  const spec = from.imports.get(name);
  if (!spec) return null;
  const file = spec.startsWith(".") ? resolve(dirname(from.file), spec) : join(nm, spec);
  return iface(`${file}.d.ts`);
}
function unknownFields(value, type, owner, path, errors) {
  type = type.trim();
  let m;
  if ((m = /^Array<(.+)>$/s.exec(type))) {
    if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, m[1], owner, `${path}[${i}]`, errors));
  } else if ((m = /^\{\s*\[key: string\]:\s*(.+?);?\s*\}$/s.exec(type))) {
    if (isMap(value)) for (const [k, v] of Object.entries(value)) unknownFields(v, m[1], owner, `${path}.${k}`, errors);
  } else if (/^I\w+$/.test(type)) {
    const t = resolveType(owner, type);
    if (t && isMap(value)) checkFields(value, t, path, errors);
  }
}
function checkFields(value, t, path, errors) {
  for (const [k, v] of Object.entries(value)) {
    if (!t.props.has(k)) errors.push(`${path}.${k}: unknown field`);
    else unknownFields(v, t.props.get(k), t, `${path}.${k}`, errors);
  }
}

// --- Chaos Mesh (no npm models exist): schemas/chaos-mesh.json with ajv -----------------
const ajv = new Ajv({ allErrors: true, strict: false });
ajv.addSchema(JSON.parse(readFileSync(join(here, "schemas/chaos-mesh.json"), "utf8")), "chaos");
const chaosSpec = {
  PodChaos: "chaos#/definitions/PodChaosSpec",
  NetworkChaos: "chaos#/definitions/NetworkChaosSpec",
  Schedule: "chaos#/definitions/ScheduleSpec",
};

async function validateObject(obj, errors) {
  const where = `${obj.kind}/${obj.metadata?.name}`;
  if (obj.apiVersion === "chaos-mesh.org/v1alpha1") {
    const ref = chaosSpec[obj.kind];
    if (!ref) return errors.push(`${where}: no schema for chaos-mesh.org kind ${obj.kind}`);
    for (const k of Object.keys(obj))
      if (!["apiVersion", "kind", "metadata", "spec"].includes(k)) errors.push(`${where}.${k}: unknown field`);
    const validate = ajv.getSchema(ref);
    if (!validate(obj.spec)) for (const e of validate.errors) errors.push(`${where}: spec${e.instancePath} ${e.message}`);
    const meta = await import(pathToFileURL(join(nm, "@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta.mjs")).href);
    try {
      new meta.ObjectMeta(obj.metadata).validate();
    } catch (e) {
      errors.push(`${where}: metadata: ${e.message}`);
    }
    checkFields(obj.metadata, iface(join(nm, "@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta.d.ts")), `${where}.metadata`, errors);
    return;
  }
  const m = await model(obj.apiVersion, obj.kind);
  if (!m) return errors.push(`${where}: no Kubernetes schema for ${obj.apiVersion} ${obj.kind}`);
  try {
    new m.Model(obj).validate();
  } catch (e) {
    errors.push(`${where}: ${e.message}`);
  }
  checkFields(obj, iface(m.dts), where, errors);
}

// --- what the binaries accept ---------------------------------------------------------------
const flagCache = new Map();
// `newt status` is being built elsewhere; until it has a flag table its flags are the ones
// promised for it (issue 8). The check switches to the real table as soon as it exists.
const PROMISED = { status: ["--job", "--wait-workers", "--timeout-ms", "--json"] };
function newtFlags(sub) {
  if (!flagCache.has(sub)) {
    const r = run(need("NEWT_BIN"), [sub, "--list-flags"]);
    if (r.code === 0) flagCache.set(sub, { flags: new Set(r.out.split("\n").filter(Boolean)), help: run(need("NEWT_BIN"), [sub, "--help"]).out });
    else if (PROMISED[sub]) {
      console.log(`note  newt ${sub} --list-flags failed (${r.err.trim()}); using the flags promised for it: ${PROMISED[sub].join(" ")}`);
      flagCache.set(sub, { flags: new Set(PROMISED[sub]), help: null });
    } else throw new Error(`newt ${sub} --list-flags failed: ${r.err.trim()}`);
  }
  return flagCache.get(sub);
}
// The flags a --help lists with no value after their name (`  --restart      ...`): given bare.
function bareFlags(help) {
  return new Set([...(help || "").matchAll(/^ {2}(--[a-z0-9-]+) {2,}/gm)].map((m) => m[1]));
}
function helpFlags(cmd, args) {
  const key = [cmd, ...args].join(" ");
  if (!flagCache.has(key)) {
    const r = run(cmd, [...args, "--help"]);
    if (r.code !== 0 && !(r.out + r.err).includes("--")) throw new Error(`${key} --help failed: ${r.err}`);
    flagCache.set(key, new Set((r.out + r.err).match(/--[a-z0-9-]+/g)));
  }
  return flagCache.get(key);
}
// Environment that newt reads besides its flags' fallbacks (README: logging).
const NEWT_LOG_ENV = new Set(["NEWT_DEBUG", "NEWT_DEBUG_SUBSYS", "NEWT_DEBUG_FILE", "NEWT_LOG_FORMAT"]);

function podSpecs(docs) {
  const out = [];
  for (const d of docs) {
    const spec = d.kind === "Pod" ? d.spec : d.spec?.template?.spec;
    if (spec && ["Pod", "Job", "Deployment", "StatefulSet"].includes(d.kind)) {
      const labels = d.kind === "Pod" ? d.metadata.labels : d.spec.template.metadata?.labels;
      out.push({ doc: d, spec, labels: labels || {}, where: `${d.kind}/${d.metadata.name}` });
    }
  }
  return out;
}
// No password on any container's command line (issue 37, item 10): a process's arguments are
// readable by anyone on the node (/proc/<pid>/cmdline). A command or argument may not name an
// environment variable from a Secret (Kubernetes expands $(NAME) there), nor one made of such
// a variable, nor carry etcdctl's password flags or a --user of the form name:password.
function checkNoPasswordArgs(docs, errors) {
  for (const { spec, where } of podSpecs(docs)) {
    for (const c of [...(spec.initContainers || []), ...spec.containers]) {
      const secret = new Set((c.env || []).filter((e) => e.valueFrom?.secretKeyRef).map((e) => e.name));
      for (let grew = true; grew;) { // a variable made of a secret one is secret too
        grew = false;
        for (const e of c.env || [])
          if (!secret.has(e.name) && typeof e.value === "string" && [...secret].some((n) => e.value.includes(`$(${n})`)))
            secret.add(e.name), (grew = true);
      }
      for (const a of [...(c.command || []), ...(c.args || [])]) {
        const named = [...secret].filter((n) => a.includes(`$(${n})`));
        if (named.length) errors.push(`${where}/${c.name}: a command-line argument expands ${named.map((n) => `$(${n})`).join(", ")}, from a Secret`);
        if (/--(new-user-)?password\b/.test(a)) errors.push(`${where}/${c.name}: a password flag on the command line: ${a.slice(0, 120)}`);
        if (/--user[= ]+["']?[^\s"':]*:/.test(a)) errors.push(`${where}/${c.name}: --user name:password on the command line: ${a.slice(0, 120)}`);
      }
    }
  }
}
function checkCommandLines(docs, errors) {
  let newtContainers = 0;
  for (const { spec, where } of podSpecs(docs)) {
    for (const c of spec.containers) {
      const cmd = c.command || [];
      const tokens = [...cmd.slice(1), ...(c.args || [])];
      const at = `${where}/${c.name}`;
      if (cmd[0] === "/usr/local/bin/newt") {
        newtContainers++;
        const sub = tokens[0];
        const { flags, help } = newtFlags(sub);
        // `newt worker <flags> -- <program...>`: the words after `--` are the program's
        const end = tokens.indexOf("--");
        if (end >= 0 && sub !== "worker") errors.push(`${at}: newt ${sub} takes no program after --`);
        if (end >= 0 && end === tokens.length - 1) errors.push(`${at}: newt ${sub}: -- with no program after it`);
        for (const t of tokens.slice(1, end >= 0 ? end : undefined)) {
          if (!t.startsWith("--")) errors.push(`${at}: newt ${sub}: "${t}" is not a flag (newt takes no positional arguments here)`);
          else if (!t.includes("=") && !bareFlags(help).has(t)) errors.push(`${at}: newt ${sub}: ${t} has no =value`);
          else if (t.includes("=") && bareFlags(help).has(t.split("=")[0])) errors.push(`${at}: newt ${sub}: ${t}: the flag takes no value`);
          else if (!flags.has(t.split("=")[0])) errors.push(`${at}: newt ${sub} does not accept ${t.split("=")[0]} (accepts ${[...flags].join(" ")})`);
        }
        for (const e of c.env || []) {
          if (!e.name.startsWith("NEWT_") || NEWT_LOG_ENV.has(e.name)) continue;
          const known = help ? help.includes(e.name) : ["NEWT_ETCD", "NEWT_ETCD_CA", "NEWT_ETCD_CERT", "NEWT_ETCD_KEY", "NEWT_ETCD_USER", "NEWT_ETCD_PASSWORD_FILE", "NEWT_JOB"].includes(e.name);
          if (!known) errors.push(`${at}: newt ${sub} does not read ${e.name}`);
        }
      } else if (cmd[0] === "etcd") {
        const flags = helpFlags("etcd", []);
        for (const t of tokens)
          if (!flags.has(t.split("=")[0])) errors.push(`${at}: etcd does not accept ${t.split("=")[0]} (etcd --help)`);
      } else if (cmd[0] === "etcdctl") {
        const positional = tokens.filter((t) => !t.startsWith("--"));
        const flags = helpFlags("etcdctl", positional);
        for (const t of tokens.filter((t) => t.startsWith("--")))
          if (!flags.has(t.split("=")[0])) errors.push(`${at}: etcdctl ${positional.join(" ")} does not accept ${t.split("=")[0]}`);
        for (const e of c.env || []) {
          if (!e.name.startsWith("ETCDCTL_") || e.name === "ETCDCTL_API") continue;
          const flag = `--${e.name.slice(8).toLowerCase().replace(/_/g, "-")}`;
          if (!flags.has(flag)) errors.push(`${at}: ${e.name} maps to ${flag}, which etcdctl does not accept`);
        }
      } else if (cmd[0] === "/bin/sh") {
        // the auth bootstrap script: its etcdctl calls are not parsed here
      } else errors.push(`${at}: unexpected command ${JSON.stringify(cmd)}: not newt, etcd or etcdctl in exec form`);
    }
  }
  if (!newtContainers) errors.push("no newt container rendered");
}

// --- the wiring a schema cannot see --------------------------------------------------------
const STANDARD_LABELS = ["helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"];
const matches = (selector, labels) => Object.entries(selector || {}).every(([k, v]) => labels?.[k] === v);

function checkWiring(docs, values, errors) {
  const byKind = (k) => docs.filter((d) => d.kind === k);
  const pods = podSpecs(docs);
  const isHook = (d) => !!d.metadata?.annotations?.["helm.sh/hook"];
  const workloads = pods.filter((p) => p.doc.kind !== "Pod" && !isHook(p.doc));
  const get = (kind, name) => docs.find((d) => d.kind === kind && d.metadata.name === name);

  for (const d of docs) {
    for (const l of STANDARD_LABELS) if (!d.metadata?.labels?.[l]) errors.push(`${d.kind}/${d.metadata?.name}: label ${l} is missing`);
    if (d.metadata?.namespace && d.metadata.namespace !== NAMESPACE) errors.push(`${d.kind}/${d.metadata.name}: namespace ${d.metadata.namespace}`);
  }
  for (const w of workloads) {
    const sel = w.doc.spec.selector?.matchLabels; // a Job's is generated
    if (w.doc.kind !== "Job" && !matches(sel, w.labels)) errors.push(`${w.where}: selector does not match its pod template`);
    for (const l of STANDARD_LABELS) if (!w.labels[l]) errors.push(`${w.where}: pod label ${l} is missing`);
  }
  // Security: non-root, read-only root, no capabilities, RuntimeDefault seccomp, limits.
  for (const { spec, where } of pods) {
    const psc = spec.securityContext || {};
    if (psc.runAsNonRoot !== true) errors.push(`${where}: pod runAsNonRoot is not true`);
    if (!(psc.runAsUser > 0)) errors.push(`${where}: pod runAsUser is not a non-root id`);
    if (psc.seccompProfile?.type !== "RuntimeDefault") errors.push(`${where}: pod seccompProfile is not RuntimeDefault`);
    if (spec.automountServiceAccountToken !== false) errors.push(`${where}: the service account token is mounted`);
    if (spec.hostNetwork || spec.hostPID || spec.hostIPC || spec.shareProcessNamespace) errors.push(`${where}: shares host or process namespaces`);
    const volumes = new Set((spec.volumes || []).map((v) => v.name));
    for (const t of (docs.find((d) => `${d.kind}/${d.metadata.name}` === where)?.spec?.volumeClaimTemplates || [])) volumes.add(t.metadata.name);
    for (const c of spec.containers) {
      const at = `${where}/${c.name}`;
      const sc = c.securityContext || {};
      if (sc.readOnlyRootFilesystem !== true) errors.push(`${at}: root filesystem is writable`);
      if (sc.allowPrivilegeEscalation !== false) errors.push(`${at}: allowPrivilegeEscalation is not false`);
      if (!sc.capabilities?.drop?.includes("ALL")) errors.push(`${at}: capabilities are not dropped`);
      if (sc.privileged) errors.push(`${at}: privileged`);
      if (!c.resources?.limits?.memory || !c.resources?.requests) errors.push(`${at}: no memory limit or no requests`);
      for (const m of c.volumeMounts || []) if (!volumes.has(m.name)) errors.push(`${at}: mounts undeclared volume ${m.name}`);
      const ports = new Set((c.ports || []).map((p) => p.name));
      for (const probe of ["livenessProbe", "readinessProbe", "startupProbe"]) {
        const port = c[probe]?.httpGet?.port ?? c[probe]?.tcpSocket?.port;
        if (typeof port === "string" && !ports.has(port)) errors.push(`${at}: ${probe} uses unknown port ${port}`);
      }
    }
    for (const v of spec.volumes || []) {
      if (v.configMap && !get("ConfigMap", v.configMap.name)) errors.push(`${where}: ConfigMap ${v.configMap.name} is not rendered`);
      if (v.persistentVolumeClaim) {
        const claim = v.persistentVolumeClaim.claimName;
        const known = get("PersistentVolumeClaim", claim) || claim === values.checkpoints.existingClaim ||
          (values.workers.extraVolumes || []).some((x) => x.persistentVolumeClaim?.claimName === claim);
        if (!known) errors.push(`${where}: claim ${claim} is neither rendered nor given in the values`);
      }
    }
  }
  // Services select pods and name their ports; StatefulSets have their headless Service.
  for (const s of byKind("Service")) {
    const targets = workloads.filter((w) => matches(s.spec.selector, w.labels));
    if (!targets.length) errors.push(`Service/${s.metadata.name}: selects no pod`);
    for (const p of s.spec.ports) {
      if (typeof p.targetPort !== "string") continue;
      for (const t of targets)
        if (!t.spec.containers.some((c) => (c.ports || []).some((cp) => cp.name === p.targetPort)))
          errors.push(`Service/${s.metadata.name}: port ${p.targetPort} is not a port of ${t.where}`);
    }
  }
  for (const s of byKind("StatefulSet")) {
    const svc = get("Service", s.spec.serviceName);
    if (!svc || svc.spec.clusterIP !== "None") errors.push(`StatefulSet/${s.metadata.name}: serviceName ${s.spec.serviceName} is not a headless Service`);
    if (s.spec.podManagementPolicy !== "Parallel") errors.push(`StatefulSet/${s.metadata.name}: pods are not managed in parallel`);
  }
  for (const kind of ["PodDisruptionBudget"]) for (const p of byKind(kind))
    if (!workloads.some((w) => matches(p.spec.selector.matchLabels, w.labels))) errors.push(`${kind}/${p.metadata.name}: selects no pod`);
  for (const n of byKind("NetworkPolicy"))
    if (!workloads.some((w) => matches(n.spec.podSelector.matchLabels, w.labels))) errors.push(`NetworkPolicy/${n.metadata.name}: selects no pod`);
  for (const sm of byKind("ServiceMonitor")) {
    const svc = byKind("Service").filter((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels));
    if (!svc.length) errors.push(`ServiceMonitor/${sm.metadata.name}: selects no Service`);
    for (const ep of sm.spec.endpoints)
      if (!svc.some((s) => s.spec.ports.some((p) => p.name === ep.port))) errors.push(`ServiceMonitor/${sm.metadata.name}: port ${ep.port} is not a Service port`);
  }
  // Chaos experiments select this release's pods of one component.
  for (const d of docs.filter((x) => x.apiVersion === "chaos-mesh.org/v1alpha1")) {
    const spec = d.kind === "Schedule" ? d.spec.podChaos || d.spec.networkChaos : d.spec;
    for (const sel of [spec.selector, spec.target?.selector].filter(Boolean)) {
      if (JSON.stringify(sel.namespaces) !== JSON.stringify([NAMESPACE])) errors.push(`${d.kind}/${d.metadata.name}: namespaces ${sel.namespaces}`);
      if (!workloads.some((w) => matches(sel.labelSelectors, w.labels))) errors.push(`${d.kind}/${d.metadata.name}: selects no pod`);
    }
    for (const name of spec.containerNames || [])
      if (!workloads.some((w) => matches(spec.selector.labelSelectors, w.labels) && w.spec.containers.some((c) => c.name === name)))
        errors.push(`${d.kind}/${d.metadata.name}: no selected pod has a container ${name}`);
  }
  checkEtcd(docs, values, errors);
  checkWorkers(docs, values, errors);
}

function checkEtcd(docs, values, errors) {
  const sts = docs.find((d) => d.kind === "StatefulSet" && d.metadata.labels["app.kubernetes.io/component"] === "etcd");
  const newtEtcd = new Set();
  for (const { spec } of podSpecs(docs))
    for (const c of spec.containers)
      for (const a of c.args || []) if (a.startsWith("--etcd=")) newtEtcd.add(a.slice(7));
  for (const { spec } of podSpecs(docs))
    for (const c of spec.containers)
      for (const e of c.env || []) if (e.name === "NEWT_ETCD" || e.name === "ETCDCTL_ENDPOINTS") newtEtcd.add(e.value);
  if (newtEtcd.size !== 1) errors.push(`the pods disagree on the etcd endpoints: ${[...newtEtcd].join(" | ")}`);
  const endpoints = [...newtEtcd][0]?.split(",") || [];
  const scheme = values.etcdClient.tls.enabled ? "https" : "http";
  if (!values.etcd.enabled) {
    if (sts) errors.push("an etcd StatefulSet is rendered though etcd.enabled is false");
    if (JSON.stringify(endpoints) !== JSON.stringify(values.externalEtcd.endpoints)) errors.push(`endpoints ${endpoints} are not externalEtcd.endpoints`);
    return;
  }
  if (!sts) return errors.push("no etcd StatefulSet");
  const n = sts.spec.replicas;
  if (n % 2 !== 1) errors.push(`etcd has ${n} members: not odd`);
  const args = Object.fromEntries(sts.spec.template.spec.containers[0].args.map((a) => a.split(/=(.*)/s).slice(0, 2)));
  const domain = `${sts.spec.serviceName}.${NAMESPACE}.svc.${values.clusterDomain}`;
  const want = [...Array(n).keys()].map((i) => `${sts.metadata.name}-${i}=${scheme}://${sts.metadata.name}-${i}.${domain}:${values.etcd.peerPort}`);
  if (args["--initial-cluster"] !== want.join(",")) errors.push(`--initial-cluster is ${args["--initial-cluster"]}, want ${want.join(",")}`);
  const wantEp = [...Array(n).keys()].map((i) => `${scheme}://${sts.metadata.name}-${i}.${domain}:${values.etcd.clientPort}`);
  if (endpoints.join(",") !== wantEp.join(",")) errors.push(`newt's etcd endpoints ${endpoints} are not the members ${wantEp}`);
  if (args["--advertise-client-urls"] !== `${scheme}://$(POD_NAME).${domain}:${values.etcd.clientPort}`) errors.push(`--advertise-client-urls ${args["--advertise-client-urls"]}`);
  if (!args["--auto-compaction-retention"] || !args["--auto-compaction-mode"]) errors.push("etcd auto-compaction is off");
  if (values.etcdClient.tls.enabled && args["--client-cert-auth"] !== "true") errors.push("etcd TLS without client certificate auth");
  if (values.etcd.persistence.enabled && !sts.spec.volumeClaimTemplates?.length) errors.push("etcd without PVCs");
  const pdb = docs.find((d) => d.kind === "PodDisruptionBudget" && matches(d.spec.selector.matchLabels, sts.spec.template.metadata.labels));
  if (n > 1 && pdb?.spec.minAvailable !== Math.floor(n / 2) + 1) errors.push(`etcd PDB minAvailable ${pdb?.spec.minAvailable}, quorum is ${Math.floor(n / 2) + 1}`);
  const c = sts.spec.template.spec.containers[0];
  if (!c.livenessProbe || !c.readinessProbe) errors.push("etcd without probes");
}

function checkWorkers(docs, values, errors) {
  const w = values.workers;
  const sts = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "worker");
  if (!sts) return errors.push("no worker Job");
  const pod = sts.spec.template.spec;
  if (sts.spec.parallelism !== w.replicas) errors.push(`worker parallelism ${sts.spec.parallelism}, workers.replicas is ${w.replicas}`);
  if (!(pod.terminationGracePeriodSeconds < w.preemptionNoticeSeconds)) errors.push(`terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} is not below the notice ${w.preemptionNoticeSeconds}`);
  // GPU mode (workers.gpu.count > 0, docs/kubernetes.md "GPU nodes"): one container holds
  // all the pod's GPUs and runs the node agent, one worker per GPU; CPU mode: perPod containers.
  const agent = w.gpu.count > 0;
  const containers = agent ? 1 : w.perPod;
  if (pod.containers.length !== containers) errors.push(`${pod.containers.length} worker containers, want ${containers} (workers.perPod ${w.perPod}, workers.gpu.count ${w.gpu.count})`);
  if (agent) checkAgent(pod, w, errors);
  const ids = new Set();
  const ports = new Set();
  for (const c of pod.containers) {
    const gpus = c.resources?.limits?.[w.gpu.resourceName];
    const device = c.args.find((a) => a.startsWith("--device="));
    if (agent ? gpus !== w.gpu.count || device !== "--device=0" : gpus !== undefined || device !== "--device=-1")
      errors.push(`${c.name}: GPU limit ${gpus} with ${device} for workers.gpu.count ${w.gpu.count}`);
    if (!agent && c.args.some((a) => a.startsWith("--local-workers"))) errors.push(`${c.name}: --local-workers without GPUs`);
    ids.add(c.env.find((e) => e.name === "NEWT_WORKER_ID")?.value);
    ports.add(c.args.find((a) => a.startsWith("--port=")));
    if ((c.command || [])[0] !== "/usr/local/bin/newt" || c.command.length !== 1) errors.push(`${c.name}: newt is not the exec-form command (PID 1)`);
    checkProgram(c, w, docs, errors);
    if (values.checkpoints.enabled && !c.volumeMounts.some((m) => m.mountPath === values.checkpoints.mountPath)) errors.push(`${c.name}: checkpoint volume not mounted`);
  }
  if (ids.size !== containers || ports.size !== containers) errors.push("worker ids or ports repeat within a pod");
  for (const key of ["nodeSelector", "tolerations"])
    if (canonical(pod[key] ?? (key === "tolerations" ? [] : {})) !== canonical(w[key])) errors.push(`worker ${key} is not workers.${key}`);
  if (w.priorityClass.create) {
    const pc = docs.find((d) => d.kind === "PriorityClass");
    if (!pc || pod.priorityClassName !== pc.metadata.name) errors.push("workers do not use the PriorityClass created for them");
  }
  // The job secret reaches every worker and every coordinator (which counts a rank's report
  // or end marker only with its proof), as a file from its Secret, and no one else
  // (docs/elastic.md, "Trust").
  const js = values.jobSecret;
  const vol = (pod.volumes || []).find((v) => v.secret?.items?.some((i) => i.key === js.key && i.path === "secret"));
  if (js.secret || js.create) {
    if (!vol) errors.push("workers: no volume with the job secret");
    else {
      if (js.secret && vol.secret.secretName !== js.secret) errors.push(`workers mount the job secret from ${vol.secret.secretName}, jobSecret.secret is ${js.secret}`);
      if (!js.secret) {
        const made = docs.find((d) => d.kind === "Secret" && d.metadata.name === vol.secret.secretName);
        const bytes = made?.data?.[js.key] ? Buffer.from(made.data[js.key], "base64").length : 0;
        if (bytes < 16) errors.push(`the job Secret ${vol.secret.secretName} is not rendered with at least 16 bytes under ${js.key} (${bytes})`);
      }
      for (const c of pod.containers) {
        const file = c.env.find((e) => e.name === "NEWT_JOB_SECRET_FILE")?.value;
        const m = c.volumeMounts.find((m) => m.name === vol.name);
        if (!m || file !== `${m.mountPath}/secret`) errors.push(`${c.name}: NEWT_JOB_SECRET_FILE ${file} is not the mounted job secret`);
      }
    }
  } else if (vol || pod.containers.some((c) => c.env.some((e) => e.name === "NEWT_JOB_SECRET_FILE"))) errors.push("jobSecret is off, yet workers get one");
  const coordJob = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator");
  const coordPod = coordJob?.spec?.template?.spec;
  if (vol && coordPod) {
    const cvol = (coordPod.volumes || []).find((v) => v.secret?.secretName === vol.secret.secretName);
    for (const c of coordPod.containers) {
      const file = c.env.find((e) => e.name === "NEWT_JOB_SECRET_FILE")?.value;
      const m = cvol && c.volumeMounts.find((m) => m.name === cvol.name);
      if (!m || file !== `${m.mountPath}/secret`) errors.push(`coordinator ${c.name}: NEWT_JOB_SECRET_FILE ${file} is not the mounted job secret`);
    }
  }
  for (const { spec, where } of podSpecs(docs))
    if (spec !== pod && spec !== coordPod && vol && (spec.volumes || []).some((v) => v.secret?.secretName === vol.secret.secretName))
      errors.push(`${where} mounts the job secret; only workers and coordinators need it`);
  if (w.topologySpread.enabled && pod.topologySpreadConstraints?.length !== w.topologySpread.topologyKeys.length) errors.push("topology spread constraints missing");
  const zone = pod.affinity?.podAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.find((t) => t.topologyKey === "topology.kubernetes.io/zone");
  if (w.sameZone && !w.affinity?.podAffinity && !(zone && matches(zone.labelSelector.matchLabels, sts.spec.template.metadata.labels)))
    errors.push("workers.sameZone: no required pod affinity keeps the workers in one zone");
  if (!w.sameZone && (w.topologySpread.topologyKeys || []).includes("topology.kubernetes.io/zone"))
    errors.push("workers spread across zones: every all-reduce would cross zones");
}

// workers.command: the worker's args end with `--` and the program's words, nothing of
// newt's after them; without one there is no `--`. workers.image: with every field empty
// the workers run the chart's image (the coordinators'); the render checks below check it set.
function checkProgram(c, w, docs, errors) {
  const end = c.args.indexOf("--");
  const program = w.command || [];
  if (!program.length && end >= 0) errors.push(`${c.name}: -- in the args without workers.command: ${c.args.join(" ")}`);
  if (program.length && (end < 0 || canonical(c.args.slice(end + 1)) !== canonical(program)))
    errors.push(`${c.name}: the args do not end with -- and workers.command ${JSON.stringify(program)}: ${JSON.stringify(c.args)}`);
  const img = w.image || {};
  const coord = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator");
  const chartImage = coord?.spec.template.spec.containers[0].image;
  if (!img.repository && !img.tag && !img.digest && c.image !== chartImage)
    errors.push(`${c.name}: image ${c.image}, the chart's image is ${chartImage} and workers.image names none`);
}

// The GPU pod: one container requesting workers.gpu.count GPUs runs the node agent
// (`newt worker --local-workers N`, cli/agent.h) with its restart budget; it declares the
// data and metrics ports of all N workers (port + i), probes the first worker, and has
// /dev/shm in memory (NCCL's shared-memory transport within the node).
function checkAgent(pod, w, errors) {
  const c = pod.containers[0];
  const n = w.gpu.count;
  const want = [`--local-workers=${n}`, `--max-restarts=${w.gpu.maxRestarts}`, `--restart-window=${w.gpu.restartWindowSeconds}`,
    `--port=${w.dataPort}`, `--metrics-port=${w.metricsPort}`, "--device=0"];
  if (c.args[0] !== "worker") errors.push(`the GPU container runs newt ${c.args[0]}, not newt worker`);
  for (const a of want) if (!c.args.includes(a)) errors.push(`the GPU container's command lacks ${a}: ${c.args.join(" ")}`);
  if (c.resources?.requests?.[w.gpu.resourceName] !== undefined && c.resources.requests[w.gpu.resourceName] !== n)
    errors.push(`the GPU container requests ${c.resources.requests[w.gpu.resourceName]} GPUs, limits ${n}`);
  const id = c.env.find((e) => e.name === "NEWT_WORKER_ID")?.value;
  if (id !== "$(POD_NAME)") errors.push(`the agent's id is ${id}: its workers are <id>-<i>, so it must be the pod's name`);
  for (let i = 0; i < n; i++)
    for (const [kind, base] of [["data", w.dataPort], ["metrics", w.metricsPort]]) {
      const p = (c.ports || []).find((x) => x.name === `${kind}-${i}`);
      if (p?.containerPort !== base + i) errors.push(`GPU container: port ${kind}-${i} is ${p?.containerPort}, want ${base + i}`);
    }
  if ((c.ports || []).length !== 2 * n) errors.push(`GPU container declares ${(c.ports || []).length} ports, want ${2 * n}`);
  if (!w.livenessProbe && c.livenessProbe?.httpGet?.port !== "metrics-0") errors.push("the GPU container's probe is not on the first worker's metrics-0");
  const shm = (c.volumeMounts || []).find((m) => m.mountPath === "/dev/shm");
  const vol = (pod.volumes || []).find((v) => v.name === shm?.name);
  if (vol?.emptyDir?.medium !== "Memory") errors.push("the GPU container's /dev/shm is not an emptyDir in memory");
  if (pod.hostIPC) errors.push("hostIPC is on: the workers of a pod share /dev/shm without it");
}

// The Jobs of coordinators and workers end as newt's exit statuses say (job/records.h):
// 0 done (completes), 3 left on SIGTERM (ignored: replaced), 4 failed and 2 a bad flag or
// spec (fail the Job), the rest counted against backoffLimit; probes on /healthz; metrics
// bound to the pod IP (and loopback, for port-forward) with POD_IP defined; the
// coordinators' kept after the end for Prometheus (checkLinger).
function checkJobs(docs, values, errors) {
  for (const comp of ["coordinator", "worker"]) {
    const job = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === comp);
    if (!job) {
      errors.push(`no ${comp} Job`);
      continue;
    }
    const at = `Job/${job.metadata.name}`;
    const pod = job.spec.template.spec;
    if (pod.restartPolicy !== "Never") errors.push(`${at}: restartPolicy ${pod.restartPolicy}, a pod failure policy needs Never`);
    if (job.spec.completions !== undefined) errors.push(`${at}: completions is set; the job ends when a pod succeeds and the rest have ended`);
    if (job.spec.backoffLimit !== values.jobPolicy.backoffLimit) errors.push(`${at}: backoffLimit ${job.spec.backoffLimit}`);
    const ttl = values.cleanup.ttlSecondsAfterFinished;
    if ((ttl >= 0 ? ttl : undefined) !== job.spec.ttlSecondsAfterFinished) errors.push(`${at}: ttlSecondsAfterFinished ${job.spec.ttlSecondsAfterFinished}, cleanup says ${ttl}`);
    const rules = job.spec.podFailurePolicy?.rules || [];
    const codes = (action) => rules.filter((r) => r.action === action && r.onExitCodes?.operator === "In").flatMap((r) => r.onExitCodes.values);
    if (!codes("Ignore").includes(3)) errors.push(`${at}: exit 3 (left on SIGTERM) is not ignored`);
    if (!codes("Ignore").includes(5)) errors.push(`${at}: exit 5 (a worker left out of a job done without it) is not ignored`);
    if (!codes("FailJob").includes(4) || !codes("FailJob").includes(2)) errors.push(`${at}: exits 4 (failed) and 2 (bad flag or spec) do not fail the Job`);
    if (!rules.some((r) => r.action === "Ignore" && r.onPodConditions?.some((c) => c.type === "DisruptionTarget"))) errors.push(`${at}: disruptions are counted as failures`);
    for (const c of pod.containers) {
      const probe = c.livenessProbe?.httpGet;
      if (probe?.path !== "/healthz") errors.push(`${at}/${c.name}: the liveness probe is not GET /healthz`);
      if (comp === "coordinator" && c.readinessProbe?.httpGet?.path !== "/healthz") errors.push(`${at}/${c.name}: the readiness probe is not GET /healthz`);
      const addr = (c.args || []).find((a) => a.startsWith("--metrics-addr="));
      if (!addr?.includes("$(POD_IP)") || !c.env?.some((e) => e.name === "POD_IP" && e.valueFrom?.fieldRef?.fieldPath === "status.podIP"))
        errors.push(`${at}/${c.name}: the metrics server does not bind the pod IP (${addr})`);
      if (addr?.includes("0.0.0.0")) errors.push(`${at}/${c.name}: the metrics server binds every address`);
      if (comp === "coordinator") checkLinger(c, values, `${at}/${c.name}`, errors);
    }
  }
}

// A Prometheus duration ("15s", "1m30s") in milliseconds.
function durationMs(d) {
  const unit = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1e3, m: 6e4, h: 3.6e6 };
  return [...d.matchAll(/([0-9.]+)(ns|us|µs|ms|s|m|h)/g)].reduce((ms, [, n, u]) => ms + Number(n) * unit[u], 0);
}

// With the ServiceMonitors or the alerts on, the coordinators linger after the job's end
// for two scrape intervals (at most an hour), so that Prometheus sees newt_job_done or
// newt_job_failed and the alerts tell an ended job from a total outage; else not at all.
function checkLinger(c, values, at, errors) {
  const m = values.coordinator.metrics;
  const arg = (c.args || []).find((a) => a.startsWith("--metrics-linger-ms="));
  const want = m.serviceMonitor.enabled || m.prometheusRule.enabled ? Math.min(3600000, 2 * durationMs(m.serviceMonitor.interval)) : undefined;
  const got = arg ? Number(arg.split("=")[1]) : undefined;
  if (got !== want) errors.push(`${at}: --metrics-linger-ms ${got}, want ${want} (two scrape intervals of ${m.serviceMonitor.interval})`);
}

// The metrics newt exports, from the sources that define them (histograms with their
// series), and etcd's own: the files of the processes that serve metrics (the coordinator,
// the worker, the etcd client of both) that call metrics_define, wherever a split moved it.
function newtMetrics() {
  const names = new Set();
  const files = ["coordinator", "worker", "rendezvous"].flatMap((d) =>
    readdirSync(join(src, d)).filter((f) => f.endsWith(".c")).map((f) => join(d, f)));
  for (const f of files) {
    const text = readFileSync(join(src, f), "utf8");
    if (!text.includes("metrics_define")) continue;
    for (const m of text.matchAll(/"(newt_[a-z_]+)"/g)) names.add(m[1]);
    for (const m of text.matchAll(/metrics_define_histogram\([^"]*"(newt_[a-z_]+)"/g))
      for (const sfx of ["_bucket", "_sum", "_count"]) names.add(m[1] + sfx);
  }
  return names;
}
// With checkpoints, every worker container appends the step log and every coordinator the
// event log under <mountPath>/runs/<job>/ on the checkpoint volume, which both mount: a
// Kubernetes job's `newt report DIR` has what it needs. Without, neither flag is given.
function checkRunLogs(docs, values, errors) {
  const ck = values.checkpoints;
  const job = values.job?.name || docs.find((d) => d.kind === "ConfigMap" && d.data?.["spec.json"]) &&
    JSON.parse(docs.find((d) => d.kind === "ConfigMap" && d.data?.["spec.json"]).data["spec.json"]).job;
  const dir = `${ck.mountPath}/runs/${job}`;
  for (const [component, flag, file] of [["worker", "--step-log", "steps.jsonl"], ["coordinator", "--event-log", "events.jsonl"]]) {
    const j = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === component);
    if (!j) continue;
    const pod = j.spec.template.spec;
    for (const c of pod.containers) {
      const given = (c.args || []).filter((a) => a.startsWith(`${flag}=`));
      if (!ck.enabled) {
        if (given.length) errors.push(`${component} ${c.name}: ${given[0]} without a checkpoint volume`);
        continue;
      }
      if (given.length !== 1 || given[0] !== `${flag}=${dir}/${file}`)
        errors.push(`${component} ${c.name}: ${flag} is ${given.join(" ") || "missing"}, expected ${flag}=${dir}/${file}`);
      if (!(c.volumeMounts || []).some((m) => m.name === "checkpoints" && m.mountPath === ck.mountPath))
        errors.push(`${component} ${c.name}: the checkpoint volume is not mounted at ${ck.mountPath}`);
    }
    if (ck.enabled && !(pod.volumes || []).some((v) => v.name === "checkpoints"))
      errors.push(`${component}: no checkpoints volume in the pod`);
  }
}

function checkMetricNames(where, exprs, errors) {
  const known = newtMetrics();
  if (known.size < 20) return errors.push(`only ${known.size} newt metrics found in the sources`);
  for (const e of exprs)
    for (const m of e.matchAll(/\b(newt_[a-z_]+)/g))
      if (!known.has(m[1])) errors.push(`${where}: ${m[1]} is not a metric newt exports (in: ${e})`);
}

// PrometheusRule: promtool check rules on its groups, and its metrics are newt's.
function checkRules(docs, errors) {
  for (const pr of docs.filter((d) => d.kind === "PrometheusRule")) {
    const file = join(tmp, `rules-${process.hrtime.bigint()}.yaml`);
    writeFileSync(file, YAML.stringify({ groups: pr.spec.groups }));
    const r = run("promtool", ["check", "rules", file]);
    if (r.code !== 0) errors.push(`PrometheusRule/${pr.metadata.name}: promtool check rules: ${(r.out + r.err).trim()}`);
    checkMetricNames(`PrometheusRule/${pr.metadata.name}`, pr.spec.groups.flatMap((g) => g.rules.map((x) => x.expr)), errors);
  }
}

// The labels Prometheus gives the series of the ServiceMonitors' scrapes that every rule
// selects on: namespace (the release's) and job (jobLabel: the value the selected Services
// carry under that label). Each newt metric a rule names must be selected with both.
function checkSelectors(docs, errors) {
  const monitors = docs.filter((d) => d.kind === "ServiceMonitor");
  if (monitors.length < 2) return errors.push(`${monitors.length} ServiceMonitors rendered`);
  const jobs = new Set(), namespaces = new Set();
  for (const m of monitors) {
    const services = docs.filter((d) => d.kind === "Service" && Object.entries(m.spec.selector.matchLabels).every(([k, v]) => d.metadata.labels?.[k] === v));
    if (!services.length) errors.push(`ServiceMonitor/${m.metadata.name} selects no Service`);
    for (const svc of services) jobs.add(svc.metadata.labels?.[m.spec.jobLabel]);
    for (const ns of m.spec.namespaceSelector?.matchNames || []) namespaces.add(ns);
  }
  if (jobs.size !== 1 || jobs.has(undefined)) return errors.push(`the ServiceMonitors give job labels ${[...jobs]}, want one`);
  if (namespaces.size !== 1 || !namespaces.has(NAMESPACE)) return errors.push(`the ServiceMonitors scrape namespaces ${[...namespaces]}`);
  const want = [`namespace="${NAMESPACE}"`, `job="${[...jobs][0]}"`];
  for (const pr of docs.filter((d) => d.kind === "PrometheusRule"))
    for (const r of pr.spec.groups.flatMap((g) => g.rules)) {
      const expr = r.expr.replace(/\s+/g, " ");
      for (const m of expr.matchAll(/\b(newt[_:][a-z_:]+)(\{[^}]*\})?/g)) {
        const matchers = (m[2] || "").slice(1, -1).split(",").map((x) => x.trim());
        for (const w of want) if (!matchers.includes(w)) errors.push(`${r.alert || r.record}: ${m[0]} lacks ${w}`);
      }
    }
}

// promtool test rules on tests/helm/rules_test.yaml against the rendered rule groups
// (annotations left out: prose, which `promtool check rules` parses; the tests check when
// alerts fire and with which labels). The tests' series are labelled for this release.
function testRules(docs, errors) {
  const pr = docs.find((d) => d.kind === "PrometheusRule");
  if (!pr) return errors.push("no PrometheusRule rendered");
  const tests = readFileSync(join(here, "rules_test.yaml"), "utf8");
  for (const m of tests.matchAll(/series: '([^']*)'/g))
    if (!m[1].includes(`namespace="${NAMESPACE}"`) || !m[1].includes(`job="${RELEASE}"`))
      errors.push(`rules_test.yaml: ${m[1]} is not labelled namespace="${NAMESPACE}", job="${RELEASE}"`);
  const groups = structuredClone(pr.spec.groups);
  for (const g of groups) for (const r of g.rules) delete r.annotations;
  const dir = mkdtempSync(join(tmp, "rules-"));
  writeFileSync(join(dir, "rules.yaml"), YAML.stringify({ groups }));
  writeFileSync(join(dir, "rules_test.yaml"), tests);
  const r = run("promtool", ["test", "rules", join(dir, "rules_test.yaml")]);
  if (r.code !== 0) errors.push(`promtool test rules: ${(r.out + r.err).trim()}`);
}

// The Grafana dashboard: JSON, and every query is on metrics newt exports.
function checkDashboard(docs, errors) {
  for (const cm of docs.filter((d) => d.kind === "ConfigMap" && d.metadata.name.endsWith("-dashboard"))) {
    let dash;
    try {
      dash = JSON.parse(cm.data["newt.json"]);
    } catch (e) {
      errors.push(`ConfigMap/${cm.metadata.name}: newt.json is not JSON: ${e.message}`);
      continue;
    }
    const exprs = (dash.panels || []).flatMap((p) => (p.targets || []).map((t) => t.expr));
    if (exprs.length < 10) errors.push(`ConfigMap/${cm.metadata.name}: only ${exprs.length} queries`);
    checkMetricNames(`dashboard ${dash.title}`, exprs, errors);
  }
}

async function checkSpec(docs, values, errors) {
  const cm = docs.find((d) => d.kind === "ConfigMap" && d.data?.["spec.json"]);
  if (!cm) return errors.push("no ConfigMap with spec.json");
  const file = join(tmp, `spec-${process.hrtime.bigint()}.json`);
  writeFileSync(file, cm.data["spec.json"]);
  // the coordinators check the spec at their start as the workers will use it: the built-in
  // trainer's model, or a program's (workers.command), which is not checked
  const coordJob = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator");
  const trainerArg = coordJob?.spec.template.spec.containers[0].args.find((a) => a.startsWith("--trainer="));
  const want = `--trainer=${(values.workers.command || []).length ? "program" : "builtin"}`;
  if (trainerArg !== want) errors.push(`the coordinators' ${trainerArg ?? "(no --trainer)"} is not ${want} (workers.command)`);
  const r = run(need("HELM_SPEC_CHECK"), [want, file]);
  if (r.code !== 0) return errors.push(`newt's spec parser refuses the rendered spec: ${r.err.trim()}`);
  const { tp, pp } = values.spec.parallel;
  const perPod = values.workers.gpu.count > 0 ? values.workers.gpu.count : values.workers.perPod;
  const dpMin = (values.workers.minReplicas * perPod) / (tp * pp);
  const dpMax = (values.workers.maxReplicas * perPod) / (tp * pp);
  if (!r.out.includes(`dp=[${dpMin},${dpMax}]`)) errors.push(`spec dp range: ${r.out.trim()}, want [${dpMin},${dpMax}]`);
  const coord = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator");
  const specArg = coord.spec.template.spec.containers[0].args.find((a) => a.startsWith("--spec="));
  const mount = coord.spec.template.spec.containers[0].volumeMounts.find((m) => specArg?.slice(7).startsWith(`${m.mountPath}/`));
  const vol = coord.spec.template.spec.volumes.find((v) => v.name === mount?.name);
  if (vol?.configMap?.name !== cm.metadata.name) errors.push(`the coordinators' --spec (${specArg}) is not the spec ConfigMap`);
}

// The auth bootstrap Job's script, run for real against a private etcd (Debian's etcd
// 3.4 on loopback ports) with the Secrets' files under a temporary folder: it must turn
// authentication on, confine the newt user to /newt/<job>/, and succeed when run again.
// Every program it runs is run through a wrapper that writes down its arguments: no password
// may be among them (issue 37, item 10; before, etcdctl had --user root:<password>).
async function checkAuthBootstrap(errors) {
  const r = helm(["template", RELEASE, chart, "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
    "--show-only", "templates/etcd-auth-job.yaml", "--set", "etcdClient.auth.enabled=true",
    "--set", "etcdClient.auth.secret=u", "--set", "etcdClient.auth.bootstrap.rootSecret=r"]);
  if (r.code !== 0) return errors.push(r.err);
  const c = YAML.parse(r.out).spec.template.spec.containers[0];
  const dir = mkdtempSync(join(tmp, "auth-"));
  const script = c.command[2].replaceAll("/etc/newt/", `${dir}/`);
  for (const [sub, pw] of [["etcd-root", "rootpw"], ["etcd-auth", "userpw"]]) {
    mkdirSync(join(dir, sub));
    writeFileSync(join(dir, sub, "password"), pw);
  }
  const shims = join(dir, "bin"), argvLog = join(dir, "argv.log");
  mkdirSync(shims);
  for (const prog of ["etcdctl", "cat", "grep", "sleep", "printf", "echo", "env"]) {
    const real = run("sh", ["-c", `command -v ${prog} || :`]).out.trim();
    if (!real.startsWith("/")) continue; // a built-in of the shell only
    writeFileSync(join(shims, prog), `#!/bin/sh\nprintf '%s ' "$0" "$@" >> '${argvLog}'\necho >> '${argvLog}'\nexec '${real}' "$@"\n`, { mode: 0o755 });
  }
  const [client, peer] = [await freePort(), await freePort()];
  const url = `http://127.0.0.1:${client}`;
  const etcd = spawn("etcd", ["--name", "t", "--data-dir", join(dir, "data"), "--listen-client-urls", url,
    "--advertise-client-urls", url, "--listen-peer-urls", `http://127.0.0.1:${peer}`,
    "--initial-advertise-peer-urls", `http://127.0.0.1:${peer}`, "--initial-cluster", `t=http://127.0.0.1:${peer}`],
    { stdio: "ignore" });
  try {
    const envOf = Object.fromEntries(c.env.filter((e) => "value" in e).map((e) => [e.name, e.value]));
    const env = { ...process.env, ETCDCTL_API: "3", ETCDCTL_ENDPOINTS: url, NEWT_ETCD_USER: "newt", NEWT_JOB: envOf.NEWT_JOB, JOB_ROLE: envOf.JOB_ROLE };
    const ctl = (...args) => run("etcdctl", ["--dial-timeout=2s", "--command-timeout=5s", ...args], { env });
    const deadline = Date.now() + 20000;
    while (ctl("endpoint", "health").code !== 0) {
      if (Date.now() > deadline) return errors.push(`etcd did not start on ${url}`);
      await new Promise((ok) => setTimeout(ok, 200));
    }
    for (const attempt of ["first", "second"]) {
      const s = run("sh", ["-ec", script], { env: { ...env, PATH: `${shims}:${env.PATH}` }, timeout: 60000 });
      if (s.code !== 0) errors.push(`${attempt} run failed (${s.code}): ${s.out}${s.err}`);
    }
    const argvs = existsSync(argvLog) ? readFileSync(argvLog, "utf8").split("\n").filter(Boolean) : [];
    if (!argvs.some((a) => a.includes("etcdctl"))) errors.push("no etcdctl run was written down: the wrappers were not used");
    for (const a of argvs)
      for (const pw of ["rootpw", "userpw"])
        if (a.includes(pw)) errors.push(`a password on a command line: ${a.replaceAll(pw, "<password>").replaceAll(shims, "").trim()}`);
    const key = `/newt/${envOf.NEWT_JOB}/probe`;
    if (ctl("user", "list").code === 0) errors.push("authentication is not enabled: an anonymous request succeeded");
    if (ctl("--user", "newt:userpw", "put", key, "v").code !== 0) errors.push(`the newt user cannot write ${key}`);
    if (ctl("--user", "newt:userpw", "get", key).out.trim() !== `${key}\nv`) errors.push(`the newt user cannot read ${key}`);
    if (ctl("--user", "newt:userpw", "put", "/elsewhere", "v").code === 0) errors.push("the newt user can write outside /newt/<job>/");
    if (ctl("--user", "newt:wrong", "get", key).code === 0) errors.push("a wrong password is accepted");
  } finally {
    etcd.kill("SIGKILL");
  }
}
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

// --- modes -------------------------------------------------------------------------------
async function lint() {
  for (const f of [null, ...ciValueFiles()]) {
    await check(`helm lint --strict ${f ? `-f ${f.slice(chart.length + 1)}` : "(defaults)"}`, (errors) => {
      const r = helm(["lint", "--strict", chart, "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, ...(f ? ["-f", f] : [])]);
      if (r.code !== 0) errors.push((r.out + r.err).trim());
    });
  }
  const own = [join(chart, "Chart.yaml"), join(chart, "values.yaml"), ...ciValueFiles(), join(here, "reject.yaml"), join(here, "rules_test.yaml"), yamllintConfig];
  await check(`yamllint the chart's YAML (${own.length} files)`, (errors) => errors.push(...yamllint(own)));
  await check("values.schema.json is JSON and a draft-07 schema", (errors) => {
    const schema = JSON.parse(readFileSync(join(chart, "values.schema.json"), "utf8"));
    if (!new Ajv({ strict: false }).validateSchema(schema)) errors.push("not a valid JSON Schema");
    const v = new Ajv({ strict: false, allErrors: true }).compile(schema);
    if (!v(loadYaml(join(chart, "values.yaml")))) errors.push(`values.yaml breaks its own schema: ${JSON.stringify(v.errors)}`);
  });
  await check("Dockerfiles: non-root numeric user (the chart's), newt as exec-form entrypoint", (errors) => {
    const uid = loadYaml(join(chart, "values.yaml")).podSecurityContext.runAsUser;
    for (const f of ["Dockerfile", "Dockerfile.cpu"]) {
      const text = readFileSync(join(src, "helm", f), "utf8");
      const stages = text.split(/^FROM /m);
      const last = stages[stages.length - 1];
      if (!new RegExp(`^USER ${uid}:${uid}$`, "m").test(last)) errors.push(`${f}: the final stage's USER is not ${uid}:${uid}`);
      if (!/^ENTRYPOINT \["\/usr\/local\/bin\/newt"\]$/m.test(last)) errors.push(`${f}: ENTRYPOINT is not ["/usr/local/bin/newt"]`);
      if (!/^COPY --from=build \/build\/newt \/usr\/local\/bin\/newt$/m.test(last)) errors.push(`${f}: newt is not installed as /usr/local/bin/newt`);
      if (!/--target newt/.test(text)) errors.push(`${f}: does not build newt from source`);
    }
    if (!/^FROM nvidia\/cuda:/m.test(readFileSync(join(src, "helm/Dockerfile"), "utf8"))) errors.push("helm/Dockerfile is not on a CUDA base");
  });
  finish();
}

async function render() {
  const defaults = loadYaml(join(chart, "values.yaml"));
  for (const f of [null, ...ciValueFiles()]) {
    const name = f ? f.slice(chart.length + 1) : "defaults";
    const values = f ? merge(defaults, loadYaml(f)) : defaults;
    const r = template(f ? [f] : []);
    let docs = [];
    await check(`${name}: helm template`, (errors) => {
      if (r.code !== 0) return errors.push(r.err.trim());
      const parsed = YAML.parseAllDocuments(r.out);
      for (const d of parsed) for (const e of d.errors) errors.push(e.message);
      docs = parsed.map((d) => d.toJS()).filter(Boolean);
      if (docs.length < 10) errors.push(`only ${docs.length} objects rendered`);
    });
    if (!docs.length) continue;
    const out = join(tmp, `${name.replace(/\W/g, "_")}.yaml`);
    writeFileSync(out, r.out);
    await check(`${name}: ${docs.length} objects valid against the Kubernetes API schemas`, async (errors) => {
      for (const d of docs) await validateObject(d, errors);
    });
    await check(`${name}: yamllint on the rendered output`, (errors) => errors.push(...yamllint([out])));
    await check(`${name}: command lines match the flags of newt, etcd and etcdctl`, (errors) => checkCommandLines(docs, errors));
    await check(`${name}: no password on any container's command line`, (errors) => checkNoPasswordArgs(docs, errors));
    await check(`${name}: the rendered spec passes newt's spec parser`, (errors) => checkSpec(docs, values, errors));
    await check(`${name}: wiring, labels, security settings`, (errors) => checkWiring(docs, values, errors));
    await check(`${name}: the Jobs end as newt's exit statuses say; probes on /healthz; metrics on the pod IP, kept after the end for Prometheus`, (errors) => checkJobs(docs, values, errors));
    await check(`${name}: the run's step and event logs on the checkpoint volume, for newt report`, (errors) => checkRunLogs(docs, values, errors));
    if (docs.some((d) => d.kind === "PrometheusRule"))
      await check(`${name}: promtool check rules on the PrometheusRule; its metrics exist`, (errors) => checkRules(docs, errors));
    if (docs.some((d) => d.kind === "ConfigMap" && d.metadata.name.endsWith("-dashboard")))
      await check(`${name}: the Grafana dashboard is JSON on metrics newt exports`, (errors) => checkDashboard(docs, errors));
  }
  await check("the chart's model presets (files/presets.json, the schema's enum) are newt's", (errors) => {
    const r = run(need("HELM_SPEC_CHECK"), ["--presets"]);
    if (r.code !== 0) return errors.push(`helm_spec_check --presets: ${r.err.trim()}`);
    const newt = JSON.parse(r.out);
    const chartPresets = JSON.parse(readFileSync(join(chart, "files/presets.json"), "utf8"));
    if (canonical(newt) !== canonical(chartPresets))
      errors.push(`files/presets.json ${canonical(chartPresets)} is not newt's ${canonical(newt)}`);
    const schema = JSON.parse(readFileSync(join(chart, "values.schema.json"), "utf8"));
    const names = schema.properties.spec.properties.model.properties.preset.enum;
    if (canonical(names) !== canonical(Object.keys(newt))) errors.push(`the schema's presets ${names} are not newt's ${Object.keys(newt)}`);
  });
  await check("GPU values (workers.gpu.count 4): one container with 4 GPUs runs the node agent; CPU values: none does", (errors) => {
    const gpu = join(tmp, "gpu4.yaml");
    writeFileSync(gpu, YAML.stringify({ workers: { gpu: { count: 4 } } }));
    const r = template([gpu]);
    if (r.code !== 0) return errors.push(r.err.trim());
    const docs = YAML.parseAllDocuments(r.out).map((d) => d.toJS()).filter(Boolean);
    const values = merge(defaults, loadYaml(gpu));
    checkWorkers(docs, values, errors);
    checkCommandLines(docs, errors);
    const job = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "worker");
    const c = job.spec.template.spec.containers;
    if (c.length !== 1 || c[0].resources.limits["nvidia.com/gpu"] !== 4 || !c[0].args.includes("--local-workers=4"))
      errors.push(`GPU pod: ${c.length} containers, ${c[0]?.resources?.limits?.["nvidia.com/gpu"]} GPUs, args ${c[0]?.args?.join(" ")}`);
    const spec = docs.find((d) => d.kind === "ConfigMap" && d.data?.["spec.json"]);
    const s = JSON.parse(spec.data["spec.json"]);
    if (s.backend !== "nccl" || s.parallel.dp_min !== 4 || s.parallel.dp_max !== 32)
      errors.push(`GPU spec: backend ${s.backend}, dp [${s.parallel.dp_min}, ${s.parallel.dp_max}], want nccl [4, 32]`);
    const svc = docs.find((d) => d.kind === "Service" && d.metadata.name === job.metadata.name);
    if (svc && svc.spec.ports.length !== 8) errors.push(`the workers' Service has ${svc.spec.ports.length} ports, want 8 (data and metrics of 4 workers)`);
    const cpu = template([]);
    const cdocs = YAML.parseAllDocuments(cpu.out).map((d) => d.toJS()).filter(Boolean);
    const cj = cdocs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "worker");
    if (cj.spec.template.spec.containers.some((x) => x.args.some((a) => a.startsWith("--local-workers")))) errors.push("CPU values run the node agent");
  });
  await check("workers.command and workers.image: newt worker <the same args> -- <command>, CPU and GPU (agent) pods", (errors) =>
    checkUserProgram(defaults, errors));
  await check("workers.restart: newt worker --restart <the same args> -- <command>, a restart-mode spec newt's parser takes",
    (errors) => checkRestartMode(defaults, errors));
  await check("the etcd auth bootstrap enables authentication on a real etcd, idempotently", checkAuthBootstrap);
  // The unknown-field check and the schema checks must be able to fail.
  await check("the validators catch a misspelt field, a bad enum and a bad flag", async (errors) => {
    const docs = YAML.parseAllDocuments(template([]).out).map((d) => d.toJS()).filter(Boolean);
    const sts = structuredClone(docs.find((d) => d.kind === "StatefulSet"));
    sts.spec.template.spec.containers[0].comand = ["x"];
    sts.spec.podManagementPolicy = "Sometimes";
    const e1 = [];
    await validateObject(sts, e1);
    if (!e1.some((e) => e.includes("comand: unknown field"))) errors.push("a misspelt container field passed");
    if (!e1.some((e) => e.includes("podManagementPolicy"))) errors.push("a bad enum passed");
    const chaos = { apiVersion: "chaos-mesh.org/v1alpha1", kind: "PodChaos", metadata: { name: "x" }, spec: { action: "pod-explode", mode: "one", selector: {}, extra: 1 } };
    const e2 = [];
    await validateObject(chaos, e2);
    if (e2.length < 2) errors.push(`a bad PodChaos passed: ${e2}`);
    const dep = structuredClone(docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator"));
    dep.spec.template.spec.containers[0].args.push("--no-such-flag=1");
    const e3 = [];
    checkCommandLines([dep], e3);
    if (!e3.some((e) => e.includes("--no-such-flag"))) errors.push("an unknown newt flag passed");
  });
  finish();
}

// The restart mode (workers.restart): every worker container runs newt worker with the args it
// has without it plus --restart, before the command; the spec says the mode and newt's own
// parser takes it; without a command the render is refused, naming the value.
async function checkRestartMode(defaults, errors) {
  const command = ["python3", "train.py", "--ckpt=/ckpt/mine.pt"];
  const plain = workerContainers({ workers: { command } }, errors);
  const over = { workers: { command, restart: true } };
  const mine = workerContainers(over, errors);
  checkCommandLines(mine.docs, errors);
  if (!mine.containers.length || mine.containers.length !== plain.containers.length)
    errors.push(`${mine.containers.length} worker containers in the restart mode, ${plain.containers.length} without`);
  mine.containers.forEach((c, i) => {
    const at = c.args.indexOf("--restart"), dash = c.args.indexOf("--");
    if (at < 0 || dash < 0 || at > dash) errors.push(`no --restart before the command: ${c.args.join(" ")}`);
    const rest = c.args.filter((a, k) => k !== at);
    if (canonical(rest) !== canonical(plain.containers[i].args))
      errors.push(`args ${JSON.stringify(c.args)}, want those without the mode and --restart`);
  });
  const cm = mine.docs.find((d) => d.kind === "ConfigMap" && d.data?.["spec.json"]);
  const spec = cm ? JSON.parse(cm.data["spec.json"]) : {};
  if (spec.restart !== true) errors.push(`the spec does not say the restart mode: ${cm?.data["spec.json"]}`);
  if (spec.ckpt?.dir) errors.push(`the restart mode's spec has newt's checkpoints on (${spec.ckpt.dir}): the program keeps its own`);
  await checkSpec(mine.docs, merge(defaults, over), errors);
  const file = join(tmp, `over-${process.hrtime.bigint()}.yaml`);
  writeFileSync(file, YAML.stringify({ workers: { restart: true } }));
  const r = template([file]);
  if (r.code === 0 || !r.err.includes("workers.restart"))
    errors.push(`workers.restart without workers.command rendered (exit ${r.code}): ${r.err.trim()}`);
}

// The worker containers of a render with these values laid over the defaults.
function workerContainers(over, errors) {
  const file = join(tmp, `over-${process.hrtime.bigint()}.yaml`);
  writeFileSync(file, YAML.stringify(over));
  const r = template([file]);
  if (r.code !== 0) {
    errors.push(r.err.trim());
    return { docs: [], containers: [] };
  }
  const docs = YAML.parseAllDocuments(r.out).map((d) => d.toJS()).filter(Boolean);
  const job = docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "worker");
  return { docs, containers: job?.spec.template.spec.containers || [] };
}

// A program of the user's (workers.command) in an image of the user's (workers.image): the
// container runs newt worker with exactly the args it has without a command, then `--` and
// the words as given; on GPU nodes the agent's flags come first, as without a command. The
// coordinators keep the chart's image.
function checkUserProgram(defaults, errors) {
  const command = ["python", "-m", "mytrain", "--lr=3e-4", "$(POD_NAME)", "two words"];
  const cases = [
    { name: "CPU", over: {}, image: { repository: "registry.example.com/ml/train", tag: "v2", pullPolicy: "Always" },
      want: "registry.example.com/ml/train:v2", policy: "Always" },
    { name: "GPU", over: { workers: { gpu: { count: 2 } } }, image: { tag: "v3" }, want: "newt:v3", policy: defaults.image.pullPolicy },
    { name: "digest", over: {}, image: { repository: "r.example/t", digest: `sha256:${"ab".repeat(32)}` },
      want: `r.example/t@sha256:${"ab".repeat(32)}`, policy: defaults.image.pullPolicy },
  ];
  for (const k of cases) {
    const plain = workerContainers(k.over, errors);
    const mine = workerContainers(merge(k.over, { workers: { command, image: k.image } }), errors);
    checkCommandLines(mine.docs, errors);
    if (!mine.containers.length || mine.containers.length !== plain.containers.length)
      errors.push(`${k.name}: ${mine.containers.length} worker containers with a command, ${plain.containers.length} without`);
    mine.containers.forEach((c, i) => {
      const want = [...plain.containers[i].args, "--", ...command];
      if (canonical(c.args) !== canonical(want)) errors.push(`${k.name}: args ${JSON.stringify(c.args)}, want ${JSON.stringify(want)}`);
      if (c.image !== k.want || c.imagePullPolicy !== k.policy) errors.push(`${k.name}: image ${c.image} (${c.imagePullPolicy}), want ${k.want} (${k.policy})`);
      if (k.name === "GPU" && !(c.args.indexOf("--local-workers=2") >= 0 && c.args.indexOf("--local-workers=2") < c.args.indexOf("--")))
        errors.push(`GPU: the agent's flags do not come before --: ${c.args.join(" ")}`);
    });
    const coord = mine.docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator");
    const plainCoord = plain.docs.find((d) => d.kind === "Job" && d.metadata.labels["app.kubernetes.io/component"] === "coordinator");
    if (coord?.spec.template.spec.containers[0].image !== plainCoord?.spec.template.spec.containers[0].image)
      errors.push(`${k.name}: workers.image changed the coordinators' image`);
  }
  // the check can fail: a program word missing, or one of newt's flags after --
  const { docs, containers } = workerContainers({ workers: { command } }, errors);
  const ok = [];
  checkProgram(containers[0], merge(defaults.workers, { command }), docs, ok);
  if (ok.length) errors.push(`the rendered program fails its own check: ${ok}`);
  const cut = structuredClone(containers[0]);
  cut.args.pop();
  const late = structuredClone(containers[0]);
  late.args.push("--threads=2");
  for (const [what, c] of [["a command missing a word", cut], ["a newt flag after the command", late]]) {
    const e = [];
    checkProgram(c, merge(defaults.workers, { command }), docs, e);
    if (!e.length) errors.push(`${what} passed`);
  }
}

async function reject() {
  await check("the defaults render (the base every case changes)", (errors) => {
    const r = template([]);
    if (r.code !== 0) errors.push(r.err);
  });
  const cases = loadYaml(join(here, "reject.yaml"));
  for (const c of cases) {
    await check(`refuses ${c.name} (${c.by})`, (errors) => {
      const file = join(tmp, "case.yaml");
      writeFileSync(file, YAML.stringify(c.values));
      const r = template([file]);
      const msg = r.err.trim();
      if (r.code === 0) return errors.push("rendered without error");
      if (!msg.includes(c.expect)) errors.push(`error does not mention "${c.expect}": ${msg}`);
      const bySchema = msg.includes("don't meet the specifications of the schema");
      if ((c.by === "schema") !== bySchema) errors.push(`refused by the ${bySchema ? "schema" : "templates"}, not the ${c.by}: ${msg}`);
    });
  }
  finish();
}

async function rules() {
  const values = join(tmp, "rules-values.yaml");
  writeFileSync(values, YAML.stringify({ coordinator: { metrics: { prometheusRule: { enabled: true }, serviceMonitor: { enabled: true } } } }));
  const r = template([values]);
  let docs = [];
  await check("the PrometheusRule and the ServiceMonitors render", (errors) => {
    if (r.code !== 0) return errors.push(r.err.trim());
    docs = YAML.parseAllDocuments(r.out).map((d) => d.toJS()).filter(Boolean);
  });
  await check("every rule selects its newt metrics by the namespace and job the ServiceMonitors' scrapes carry", (errors) => checkSelectors(docs, errors));
  await check("promtool test rules (rules_test.yaml): a total outage alerts, a healthy, a done or a failed job does not (NewtJobFailed aside)", (errors) => testRules(docs, errors));
  finish();
}

const modes = { lint, render, reject, rules };
const mode = modes[process.argv[2]];
if (!mode) {
  console.error("usage: node check.mjs lint|render|reject|rules");
  process.exit(2);
}
await mode();
