// Checks helm/tributary with the real helm binary; run through helm/tests/run.sh, which fetches
// the tools. Modes:
//   chart              helm lint --strict; helm template for every value set in VALUE_SETS; each
//                      object validated against the Kubernetes OpenAPI schemas (kubernetes-models)
//                      and the properties that matter asserted; bad values fail with the schema's
//                      message; the examples and the Dockerfile checked.
//   flags BIN_DIR      the controller and the agent started with exactly the command and args the
//                      chart renders (on loopback ports), the agent registers, and the helm test
//                      pod's script passes against them (and fails before any agent registered).
//   flags-persistence BIN_DIR   the same with controller.persistence.enabled (--state-db).
//   flags-tls BIN_DIR  the same with tls.enabled: certificates made with openssl at tls.mountPath;
//                      plaintext refused, mTLS health SERVING, the test pod's script over mTLS.
import { execFileSync, spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const args = process.argv.slice(2);
function takeOption(name) {
  const i = args.indexOf(name);
  if (i < 0) throw new Error(`missing ${name}`);
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
}
const HELM = takeOption("--helm");
const MODULES = takeOption("--modules");
const require = createRequire(path.join(MODULES, "noop.js"));
const yaml = require("js-yaml");
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "../..");
const CHART = path.join(ROOT, "helm/tributary");
const [MODE, BIN_DIR] = args;

let failures = 0;
function check(name, fn) {
  try {
    fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}\n     ${String(e.message).split("\n").join("\n     ")}`);
  }
}

function helm(helmArgs, { expectFailure = false } = {}) {
  const r = spawnSync(HELM, helmArgs, { encoding: "utf8", maxBuffer: 64 << 20 });
  const stderr = r.stderr.split("\n").filter((l) => !l.includes("found symbolic link")).join("\n");
  if (!expectFailure && r.status !== 0) {
    throw new Error(`helm ${helmArgs.join(" ")} failed (${r.status}):\n${stderr}`);
  }
  return { status: r.status, stdout: r.stdout, stderr };
}

function render(set, extra = []) {
  const flags = [];
  for (const [k, v] of Object.entries(set)) flags.push("--set-json", `${k}=${JSON.stringify(v)}`);
  const out = helm(["template", "rel", CHART, "--namespace", "ml", ...flags, ...extra]).stdout;
  return yaml.loadAll(out).filter((d) => d);
}

const byKind = (objs, kind) => objs.filter((o) => o.kind === kind);
const one = (objs, kind, pred = () => true) => {
  const found = byKind(objs, kind).filter(pred);
  assert.equal(found.length, 1, `expected one ${kind}, got ${found.length}`);
  return found[0];
};
const argValue = (argv, flag) => {
  const i = argv.indexOf(flag);
  assert.ok(i >= 0 && i + 1 < argv.length, `no ${flag} in ${JSON.stringify(argv)}`);
  return argv[i + 1];
};
const portOf = (hostPort) => Number(hostPort.slice(hostPort.lastIndexOf(":") + 1));

// --- OpenAPI validation -------------------------------------------------------------------------
// The validators are ES modules behind an exports map: their API group indexes are imported by path.
const MODELS = {};
for (const [group, dir] of Object.entries({
  v1: "kubernetes-models/v1", "apps/v1": "kubernetes-models/apps/v1", "batch/v1": "kubernetes-models/batch/v1",
  "policy/v1": "kubernetes-models/policy/v1", "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
})) {
  MODELS[group] = await import(pathToFileURL(path.join(MODULES, dir, "index.js")).href);
}
// cert-manager's Certificate has no model in kubernetes-models: its required fields and enums
// (cert-manager.io/v1 CRD) are checked here.
const CERT_USAGES = new Set(["signing", "digital signature", "content commitment", "key encipherment",
  "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
  "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
  "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"]);
class Certificate {
  constructor(obj) { this.obj = obj; }
  validate() {
    const { metadata, spec } = this.obj;
    assert.ok(metadata?.name, "metadata.name");
    assert.ok(typeof spec?.secretName === "string" && spec.secretName, "spec.secretName is required");
    assert.ok(typeof spec.issuerRef?.name === "string" && spec.issuerRef.name, "spec.issuerRef.name is required");
    assert.ok(["Issuer", "ClusterIssuer"].includes(spec.issuerRef.kind), `issuerRef.kind ${spec.issuerRef.kind}`);
    assert.ok(spec.commonName || spec.dnsNames?.length, "a commonName or dnsNames");
    for (const u of spec.usages || []) assert.ok(CERT_USAGES.has(u), `usage ${u}`);
    assert.ok(["RSA", "ECDSA", "Ed25519"].includes(spec.privateKey?.algorithm ?? "RSA"));
    assert.ok(["Never", "Always", undefined].includes(spec.privateKey?.rotationPolicy));
    for (const d of ["duration", "renewBefore"]) {
      if (spec[d] !== undefined) assert.match(spec[d], /^([0-9]+(\.[0-9]+)?(h|m|s))+$/, d);
    }
    const known = new Set(["secretName", "issuerRef", "commonName", "dnsNames", "ipAddresses", "uris",
      "emailAddresses", "duration", "renewBefore", "privateKey", "usages", "isCA", "subject",
      "secretTemplate", "keystores", "revisionHistoryLimit", "additionalOutputFormats", "literalSubject",
      "nameConstraints", "otherNames", "encodeUsagesInRequest"]);
    for (const k of Object.keys(spec)) assert.ok(known.has(k), `unknown field spec.${k}`);
  }
}
MODELS["cert-manager.io/v1"] = { Certificate };
function modelClass(obj) {
  const Model = MODELS[obj.apiVersion]?.[obj.kind];
  if (!Model) throw new Error(`no OpenAPI model for ${obj.apiVersion} ${obj.kind}`);
  return Model;
}
function validate(obj) {
  const Model = modelClass(obj);
  try {
    new Model(obj).validate();
  } catch (e) {
    throw new Error(`${obj.kind}/${obj.metadata?.name}: ${e.message}`);
  }
}
// Validates a pod template (e.g. a PyTorchJob replica's) as the Pod it becomes.
function validatePodTemplate(template, what) {
  const Pod = MODELS.v1.Pod;
  try {
    new Pod({ apiVersion: "v1", kind: "Pod", metadata: template.metadata || {}, spec: template.spec }).validate();
  } catch (e) {
    throw new Error(`${what}: ${e.message}`);
  }
}

// --- value sets --------------------------------------------------------------------------------
const VALUE_SETS = {
  default: {},
  "gpu-only": { "agent.gpu.enabled": true, "agent.cpu.enabled": false, "agent.gpu.summation": false, "agent.gpu.peerRecoveryMiB": 1024, "agent.gpu.bufferPoolMiB": 64, "agent.gpu.earlyMessageMiB": 512 },
  "spare-cpu": { "agent.cpu.enabled": true, "agent.cpu.tolerations": [{ key: "spare", operator: "Exists", effect: "NoSchedule" }] },
  "host-network": { "agent.hostNetwork": true, "agent.ucx": { netDevices: "mlx5_0:1", tls: "rc,sm,self" }, "agent.nicGbps": 100 },
  persistence: { "controller.persistence.enabled": true, "controller.persistence.storageClassName": "fast" },
  observability: {
    "metrics.serviceMonitor.enabled": true, "metrics.serviceMonitor.labels": { release: "prometheus" },
    "metrics.prometheusRule.enabled": true, "metrics.dashboards.enabled": true,
    "networkPolicy.enabled": true, "agent.cpu.enabled": true,
    "networkPolicy.metricsFrom": [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "monitoring" } } }],
  },
  "socket-access": { "agent.socketGroup": "training", "agent.socketAllowUids": [1000, 1001] },
  "no-agents": { "agent.gpu.enabled": false, "metrics.serviceMonitor.enabled": true },
  "tls-secret": {
    "tls.enabled": true, "tls.secretName": "tributary-tls", "tls.agentSecretName": "tributary-agents-tls",
    "tls.admins": ["ops", "launcher"], "tls.serverName": "controller.example", "agent.cpu.enabled": true,
    "controller.persistence.enabled": true,
  },
  "tls-cert-manager": {
    "tls.enabled": true, "tls.certManager.enabled": true,
    "tls.certManager.issuerRef": { name: "cluster-ca", kind: "ClusterIssuer", group: "cert-manager.io" },
    "tls.agentIdentity": "agents.tributary",
  },
};

function assertChartObjects(name, set, objs) {
  const get = (k, dflt) => (k in set ? set[k] : dflt);
  const deploy = one(objs, "Deployment");
  const pod = deploy.spec.template.spec;
  const c = pod.containers[0];
  assert.equal(deploy.spec.replicas, 1);
  assert.equal(deploy.spec.strategy.type, "Recreate");
  assert.deepEqual(c.command, ["tributary-controller"]);
  const grpcPort = portOf(argValue(c.args, "--listen"));
  const metricsPort = portOf(argValue(c.args, "--metrics-listen"));
  const ports = Object.fromEntries(c.ports.map((p) => [p.name, p.containerPort]));
  assert.deepEqual(ports, { grpc: grpcPort, metrics: metricsPort }, "container ports = --listen / --metrics-listen");
  const tls = get("tls.enabled", false);
  for (const probe of [c.livenessProbe, c.readinessProbe]) {
    if (tls) {
      // kubelet's gRPC probe is plaintext, which the mTLS port refuses.
      assert.equal(probe.tcpSocket?.port, grpcPort, "with TLS, TCP probes on the --listen port");
      assert.equal(probe.grpc, undefined);
    } else {
      assert.equal(probe.grpc?.port, grpcPort, "probes are gRPC health probes on the --listen port");
    }
  }
  assert.equal(pod.securityContext.runAsNonRoot, true);
  const persistent = get("controller.persistence.enabled", false);
  assert.equal(c.args.includes("--state-db"), persistent, "--state-db iff persistence");
  if (persistent) {
    const db = argValue(c.args, "--state-db");
    const mount = c.volumeMounts.find((m) => m.name === "state");
    assert.equal(path.dirname(db), mount.mountPath);
    const claim = pod.volumes.find((v) => v.name === "state").persistentVolumeClaim.claimName;
    const pvc = one(objs, "PersistentVolumeClaim");
    assert.equal(pvc.metadata.name, claim);
    assert.equal(pvc.spec.storageClassName, set["controller.persistence.storageClassName"]);
  } else {
    assert.equal(byKind(objs, "PersistentVolumeClaim").length, 0);
  }
  const svc = one(objs, "Service", (s) => s.metadata.name.endsWith("-controller"));
  assert.deepEqual(Object.fromEntries(svc.spec.ports.map((p) => [p.name, [p.port, p.targetPort]])),
    { grpc: [grpcPort, "grpc"], metrics: [metricsPort, "metrics"] });
  for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(deploy.spec.template.metadata.labels[k], v);
  const pdb = one(objs, "PodDisruptionBudget");
  for (const [k, v] of Object.entries(pdb.spec.selector.matchLabels)) assert.equal(deploy.spec.template.metadata.labels[k], v);

  const controllerAddress = `${svc.metadata.name}.ml.svc:${grpcPort}`;
  const pools = { gpu: get("agent.gpu.enabled", true), cpu: get("agent.cpu.enabled", false) };
  const daemonSets = byKind(objs, "DaemonSet");
  assert.deepEqual(daemonSets.map((d) => d.metadata.labels["tributary.io/pool"]).sort(),
    Object.keys(pools).filter((p) => pools[p]).sort());
  for (const ds of daemonSets) {
    const pool = ds.metadata.labels["tributary.io/pool"];
    const spec = ds.spec.template.spec;
    const a = spec.containers[0];
    assert.deepEqual(a.command, ["tributary-agent"]);
    assert.notEqual(spec.hostIPC, true, `${pool}: no hostIPC (memfds travel over the socket)`);
    assert.equal(spec.hostNetwork === true, get("agent.hostNetwork", false), `${pool}: hostNetwork`);
    if (spec.hostNetwork) assert.equal(spec.dnsPolicy, "ClusterFirstWithHostNet");
    assert.equal(argValue(a.args, "--controller"), controllerAddress);
    assert.equal(argValue(a.args, "--node-id"), "$(NODE_NAME)");
    assert.equal(argValue(a.args, "--data-plane-host"), "$(POD_IP)");
    const listen = argValue(a.args, "--listen");
    const hostDir = spec.volumes.find((v) => v.name === "socket-dir").hostPath.path;
    assert.equal(listen, `unix:${hostDir}/agent.sock`);
    assert.equal(a.volumeMounts.find((m) => m.name === "socket-dir").mountPath, hostDir);
    const env = Object.fromEntries(a.env.map((e) => [e.name, e.value ?? e.valueFrom?.fieldRef?.fieldPath]));
    const ucx = get("agent.ucx", { netDevices: "all", tls: "tcp" });
    assert.equal(env.UCX_NET_DEVICES, ucx.netDevices);
    assert.equal(env.UCX_TLS, ucx.tls);
    assert.equal(env.NODE_NAME, "spec.nodeName");
    assert.equal(env.POD_IP, "status.podIP");
    const metrics = portOf(argValue(a.args, "--metrics-listen"));
    assert.equal(a.ports.find((p) => p.name === "metrics").containerPort, metrics);
    assert.equal(a.livenessProbe.httpGet.port, "metrics");
    assert.equal(a.args.includes("--socket-group") ? argValue(a.args, "--socket-group") : "",
                 get("agent.socketGroup", "2000"));
    assert.deepEqual(a.args.flatMap((x, i) => (x === "--socket-allow-uid" ? [Number(a.args[i + 1])] : [])),
                     get("agent.socketAllowUids", []));
    const nic = get("agent.nicGbps", 0);
    assert.equal(a.args.includes("--nic-gbps") ? Number(argValue(a.args, "--nic-gbps")) : 0, nic);
    const tolerations = spec.tolerations || [];
    if (pool === "gpu") {
      assert.ok(tolerations.some((t) => t.key === "nvidia.com/gpu" && t.operator === "Exists"), "gpu: nvidia.com/gpu toleration");
      assert.equal(spec.nodeSelector["nvidia.com/gpu.present"], "true");
      assert.equal(a.args.includes("--no-summation"), get("agent.gpu.summation", true) === false);
      assert.equal(Number(argValue(a.args, "--peer-recovery-mib")), get("agent.gpu.peerRecoveryMiB", 4096));
      assert.equal(Number(argValue(a.args, "--buffer-pool-mib")), get("agent.gpu.bufferPoolMiB", 512));
      assert.equal(Number(argValue(a.args, "--early-message-mib")), get("agent.gpu.earlyMessageMiB", 256));
    } else {
      assert.equal(a.args.includes("--no-summation"), false, "spare CPU agents sum");
      assert.equal(a.args.includes("--peer-recovery-mib"), false, "spare CPU agents are not workers");
      assert.equal(a.args.includes("--buffer-pool-mib"), false, "spare CPU agents fuse nothing");
      assert.equal(a.args.includes("--early-message-mib"), false, "spare CPU agents are not workers");
      assert.equal(spec.nodeSelector["tributary.io/spare"], "true");
      assert.deepEqual(tolerations, get("agent.cpu.tolerations", []));
    }
  }

  const monitors = byKind(objs, "ServiceMonitor");
  if (get("metrics.serviceMonitor.enabled", false)) {
    assert.equal(monitors.length, daemonSets.length ? 2 : 1);
    for (const sm of monitors) {
      assert.equal(sm.spec.endpoints[0].honorLabels, true, "honorLabels");
      assert.ok(sm.spec.endpoints[0].relabelings.some((r) => r.targetLabel === "job" && r.replacement.startsWith("tributary")),
        "scrape job named tributary...");
      const target = byKind(objs, "Service").filter((s) =>
        Object.entries(sm.spec.selector.matchLabels).every(([k, v]) => s.metadata.labels[k] === v));
      assert.equal(target.length, 1, `ServiceMonitor ${sm.metadata.name} selects one Service`);
      assert.ok(target[0].spec.ports.some((p) => p.name === sm.spec.endpoints[0].port));
      for (const [k, v] of Object.entries(set["metrics.serviceMonitor.labels"] || {})) assert.equal(sm.metadata.labels[k], v);
    }
    if (daemonSets.length) {
      const agentSvc = one(objs, "Service", (s) => s.metadata.name.endsWith("-agent-metrics"));
      for (const ds of daemonSets) {
        for (const [k, v] of Object.entries(agentSvc.spec.selector)) assert.equal(ds.spec.template.metadata.labels[k], v);
      }
    }
  } else {
    assert.equal(monitors.length, 0);
  }

  const rules = byKind(objs, "PrometheusRule");
  if (get("metrics.prometheusRule.enabled", false)) {
    const source = yaml.load(fs.readFileSync(path.join(ROOT, "dashboards/alerts.yml"), "utf8"));
    assert.equal(rules.length, 1);
    assert.deepEqual(rules[0].spec.groups, source.groups, "PrometheusRule = dashboards/alerts.yml");
  } else {
    assert.equal(rules.length, 0);
  }
  const dashboards = byKind(objs, "ConfigMap").filter((m) => m.metadata.labels.grafana_dashboard === "1");
  if (get("metrics.dashboards.enabled", false)) {
    const files = fs.readdirSync(path.join(ROOT, "dashboards")).filter((f) => f.endsWith(".json")).sort();
    assert.deepEqual(dashboards.flatMap((m) => Object.keys(m.data)).sort(), files);
    for (const m of dashboards) {
      const [file, text] = Object.entries(m.data)[0];
      assert.equal(text, fs.readFileSync(path.join(ROOT, "dashboards", file), "utf8").replace(/\n$/, ""),
        `${file}: ConfigMap = dashboards/${file}`);
      JSON.parse(text);
      assert.equal(m.metadata.annotations.grafana_folder, "Tributary");
    }
  } else {
    assert.equal(dashboards.length, 0);
  }

  const policies = byKind(objs, "NetworkPolicy");
  if (get("networkPolicy.enabled", false)) {
    const np = one(objs, "NetworkPolicy");
    const grpcRule = np.spec.ingress.find((r) => r.ports[0].port === grpcPort);
    const selects = (peer, labels) => peer.podSelector &&
      Object.entries(peer.podSelector.matchLabels).every(([k, v]) => labels[k] === v);
    for (const ds of daemonSets) {
      assert.ok(grpcRule.from.some((p) => selects(p, ds.spec.template.metadata.labels)), "agents reach the controller");
    }
    const testPod = one(objs, "Pod");
    assert.ok(grpcRule.from.some((p) => selects(p, testPod.metadata.labels)), "the test pod reaches the controller");
    const metricsRule = np.spec.ingress.find((r) => r.ports[0].port === metricsPort);
    assert.deepEqual(metricsRule.from, set["networkPolicy.metricsFrom"]);
  } else {
    assert.equal(policies.length, 0);
  }
  assertTls(set, objs, { deploy, daemonSets, controllerAddress });
  const testPod = one(objs, "Pod");
  assert.equal(testPod.metadata.annotations["helm.sh/hook"], "test");
  assert.equal(testPod.spec.containers[0].env.find((e) => e.name === "TRIBUTARY_CONTROLLER").value, controllerAddress);
  assert.equal(testPod.spec.containers[0].image, c.image, "the test pod runs the controller image (it has the CLI)");
}

// mTLS: every gRPC process gets --tls-cert/--tls-key/--tls-ca inside the mount of its role's
// Secret (the controller's, the agents', the test pod's), the controller its authorization
// flags, and cert-manager's Certificates write exactly the Secrets the pods mount.
function assertTls(set, objs, { deploy, daemonSets, controllerAddress }) {
  const get = (k, dflt) => (k in set ? set[k] : dflt);
  const enabled = get("tls.enabled", false);
  const certManager = enabled && get("tls.certManager.enabled", false);
  const mountPath = get("tls.mountPath", "/etc/tributary/tls");
  const testPod = one(objs, "Pod");
  const tlsSecretOf = (podSpec, container) => {
    const mount = (container.volumeMounts || []).find((m) => m.name === "tls");
    const volume = (podSpec.volumes || []).find((v) => v.name === "tls");
    if (!enabled) {
      assert.equal(mount, undefined, "no TLS mount without tls.enabled");
      assert.equal(volume, undefined);
      return undefined;
    }
    assert.equal(mount.mountPath, mountPath);
    assert.equal(mount.readOnly, true);
    return volume.secret.secretName;
  };
  const flagsIn = (argv, what, client) => {
    if (!enabled) {
      assert.ok(!argv.some((a) => a.startsWith("--tls-")), `${what}: no --tls-* flags without tls.enabled`);
      return;
    }
    assert.equal(argValue(argv, "--tls-cert"), `${mountPath}/tls.crt`, what);
    assert.equal(argValue(argv, "--tls-key"), `${mountPath}/tls.key`, what);
    assert.equal(argValue(argv, "--tls-ca"), `${mountPath}/ca.crt`, what);
    assert.equal(Number(argValue(argv, "--tls-reload-seconds")), get("tls.reloadSeconds", 30), what);
    const serverName = get("tls.serverName", "");
    if (client && serverName) assert.equal(argValue(argv, "--tls-server-name"), serverName, what);
    else assert.ok(!argv.includes("--tls-server-name"), what);
  };
  const full = deploy.metadata.name.replace(/-controller$/, "");
  const expected = (role) => certManager ? `${full}-${role}-tls`
    : (role === "agent" && get("tls.agentSecretName", "")) || (role === "client" && get("tls.clientSecretName", ""))
      || get("tls.secretName", "");

  const c = deploy.spec.template.spec.containers[0];
  flagsIn(c.args, "controller", false);
  assert.equal(tlsSecretOf(deploy.spec.template.spec, c), enabled ? expected("controller") : undefined);
  const valuesOf = (argv, flag) => argv.flatMap((a, i) => (a === flag ? [argv[i + 1]] : []));
  assert.deepEqual(valuesOf(c.args, "--tls-admin"), enabled ? get("tls.admins", []) : []);
  assert.deepEqual(valuesOf(c.args, "--tls-fleet-identity"), enabled ? [get("tls.agentIdentity", "tributary-agent")] : []);
  for (const ds of daemonSets) {
    const a = ds.spec.template.spec.containers[0];
    flagsIn(a.args, `agent ${ds.metadata.name}`, true);
    assert.equal(tlsSecretOf(ds.spec.template.spec, a), enabled ? expected("agent") : undefined);
  }
  const t = testPod.spec.containers[0];
  const envFlags = (t.env.find((e) => e.name === "TRIBUTARY_TLS_FLAGS")?.value ?? "").split(" ").filter((x) => x);
  flagsIn(envFlags, "helm test pod", true);
  assert.equal(tlsSecretOf(testPod.spec, t), enabled ? expected("client") : undefined);
  assert.match(t.args[0], /tributary --controller "\$TRIBUTARY_CONTROLLER" \$TRIBUTARY_TLS_FLAGS nodes/);

  const certs = byKind(objs, "Certificate");
  if (!certManager) {
    assert.equal(certs.length, 0);
    return;
  }
  assert.deepEqual(certs.map((x) => x.spec.secretName).sort(),
    ["agent", "client", "controller"].map(expected).sort(), "one Certificate per mounted Secret");
  for (const cert of certs) assert.deepEqual(cert.spec.issuerRef, set["tls.certManager.issuerRef"]);
  const controllerCert = certs.find((x) => x.spec.secretName === expected("controller"));
  const host = controllerAddress.slice(0, controllerAddress.lastIndexOf(":"));
  assert.ok(controllerCert.spec.dnsNames.includes(host), `the controller's certificate names ${host}`);
  assert.ok(controllerCert.spec.usages.includes("server auth"));
  const agentCert = certs.find((x) => x.spec.secretName === expected("agent"));
  assert.equal(agentCert.spec.commonName, get("tls.agentIdentity", "tributary-agent"),
    "the agents' certificate names the controller's --tls-fleet-identity");
  assert.ok(agentCert.spec.usages.includes("client auth"));
}

function checkChart() {
  check("helm lint --strict", () => helm(["lint", "--strict", CHART]));
  for (const [name, set] of Object.entries(VALUE_SETS)) {
    let objs;
    check(`helm template (${name})`, () => { objs = render(set); });
    if (!objs) continue;
    check(`${name}: ${objs.length} objects validate against the Kubernetes OpenAPI schemas`, () => objs.forEach(validate));
    check(`${name}: properties`, () => assertChartObjects(name, set, objs));
  }
  // Bad values fail at install with the schema's message.
  const bad = [
    [{ "controller.grpcPort": -1 }, "/controller/grpcPort': minimum: got -1"],
    [{ "agent.metricsPort": 70000 }, "/agent/metricsPort': maximum: got 70,000"],
    [{ "agent.gpu.bogus": 1 }, "additional properties 'bogus' not allowed"],
    [{ "agent.gpu.earlyMessageMiB": 0 }, "/agent/gpu/earlyMessageMiB': minimum: got 0"],
    [{ "tls.bogus": 1 }, "additional properties 'bogus' not allowed"],
    [{ "tls.reloadSeconds": 0 }, "/tls/reloadSeconds': minimum: got 0"],
    [{ "tls.certManager.issuerRef": { name: "ca", kind: "Bogus" } }, "/tls/certManager/issuerRef/kind"],
    [{ "tls.enabled": true }, "tls.enabled needs tls.secretName"],
    [{ "tls.enabled": true, "tls.certManager.enabled": true }, "tls.certManager.enabled needs tls.certManager.issuerRef.name"],
    [{ "log.level": "loud" }, "/log/level"],
    [{ "agent.socketDir": "run/tributary" }, "/agent/socketDir"],
    [{ "agent.socketAllowUids": [-1] }, "/agent/socketAllowUids/0"],
    [{ "agent.socketGroup": "a b" }, "/agent/socketGroup"],
  ];
  for (const [set, message] of bad) {
    check(`bad values ${JSON.stringify(set)} fail with the schema's message`, () => {
      const flags = Object.entries(set).flatMap(([k, v]) => ["--set-json", `${k}=${JSON.stringify(v)}`]);
      const r = helm(["template", "rel", CHART, ...flags], { expectFailure: true });
      assert.notEqual(r.status, 0, "helm template succeeded");
      assert.ok(r.stderr.includes(message), `expected "${message}" in:\n${r.stderr}`);
    });
  }
  checkExamples();
  checkDockerfile();
  check("helm/README.md documents every key of values.schema.json", checkValuesDocumented);
}

// Rows of the values table start with "| `key` / `.sibling` |"; a key is documented when it or an
// ancestor is listed.
function checkValuesDocumented() {
  const schema = JSON.parse(fs.readFileSync(path.join(CHART, "values.schema.json"), "utf8"));
  const leaves = [];
  (function walk(node, prefix) {
    if (node.properties && node.additionalProperties === false) {
      for (const [k, v] of Object.entries(node.properties)) walk(v, prefix ? `${prefix}.${k}` : k);
    } else {
      leaves.push(prefix);
    }
  })(schema, "");
  const documented = new Set();
  const readme = fs.readFileSync(path.join(ROOT, "helm/README.md"), "utf8");
  const section = readme.split(/^## /m).find((s) => s.startsWith("Values\n"));
  assert.ok(section, 'helm/README.md has no "## Values" section');
  for (const line of section.split("\n")) {
    const m = line.match(/^\| (`[^|]*`) \|/);
    if (!m) continue;
    const keys = [...m[1].matchAll(/`([^`]+)`/g)].map((x) => x[1]);
    const first = keys[0];
    for (const k of keys) {
      documented.add(k.startsWith(".") ? first.slice(0, first.lastIndexOf(".")) + k : k);
    }
  }
  const missing = leaves.filter((leaf) => {
    const parts = leaf.split(".");
    return !parts.some((_, i) => documented.has(parts.slice(0, i + 1).join(".")));
  });
  assert.deepEqual(missing, [], "values without a row in helm/README.md's values table");
  const unknown = [...documented].filter((d) => !leaves.some((l) => l === d || l.startsWith(`${d}.`)));
  assert.deepEqual(unknown, [], "rows of helm/README.md's values table naming no value");
}

// --- examples ----------------------------------------------------------------------------------
function checkExamples() {
  const defaults = render({});
  const ds = one(defaults, "DaemonSet");
  const socketDir = ds.spec.template.spec.volumes.find((v) => v.name === "socket-dir").hostPath.path;
  const socket = argValue(ds.spec.template.spec.containers[0].args, "--listen");
  const dir = path.join(ROOT, "helm/examples");
  const files = fs.readdirSync(dir).filter((f) => f.endsWith(".yaml"));
  check("examples: a plain Job and a PyTorchJob", () => {
    assert.deepEqual(files.sort(), ["job.yaml", "pytorchjob.yaml"]);
  });
  for (const file of files) {
    check(`examples/${file}: validates, mounts the agent socket, runs train_mlp.py with tributary.torch`, () => {
      const docs = yaml.loadAll(fs.readFileSync(path.join(dir, file), "utf8")).filter((d) => d);
      const templates = [];
      for (const d of docs) {
        if (d.kind === "PyTorchJob") {
          assert.equal(d.apiVersion, "kubeflow.org/v1");
          for (const [role, r] of Object.entries(d.spec.pytorchReplicaSpecs)) {
            validatePodTemplate(r.template, `${file} ${role}`);
            templates.push(r.template);
          }
        } else {
          validate(d);
          if (d.kind === "Job") templates.push(d.spec.template);
        }
      }
      assert.ok(templates.length > 0);
      for (const t of templates) {
        assert.notEqual(t.spec.hostIPC, true);
        assert.ok((t.spec.securityContext?.supplementalGroups || []).length > 0, "a group for the agent's sockets");
        const vol = t.spec.volumes.find((v) => v.hostPath?.path === socketDir);
        assert.ok(vol, `a hostPath volume of ${socketDir}`);
        const c = t.spec.containers[0];
        const mount = c.volumeMounts.find((m) => m.name === vol.name);
        assert.equal(`unix:${mount.mountPath}/agent.sock`, socket);
        const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
        assert.equal(env.TRIBUTARY_AGENT_ADDRESS, socket);
        for (const k of ["TRIBUTARY_JOB", "TRIBUTARY_LOCAL_RANK", "TRIBUTARY_LOCAL_SIZE"]) assert.ok(env[k], k);
        const cmd = [...(c.command || []), ...(c.args || [])].join(" ");
        assert.ok(cmd.includes("train_mlp.py"), cmd);
      }
    });
  }
  check("examples: train_mlp.py uses tributary.torch", () => {
    assert.match(fs.readFileSync(path.join(ROOT, "client/python/examples/train_mlp.py"), "utf8"), /import tributary\.torch/);
  });
}

// --- Dockerfile --------------------------------------------------------------------------------
function parseDockerfile(file) {
  const text = fs.readFileSync(file, "utf8").replace(/\\\n/g, " ");
  const stages = {};
  let stage = null;
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const [instr, ...rest] = line.split(/\s+/);
    const arg = rest.join(" ");
    if (instr.toUpperCase() === "FROM") {
      const m = arg.match(/^(\S+)(?:\s+AS\s+(\S+))?$/i);
      assert.ok(m, `FROM ${arg}`);
      stage = { base: m[1], lines: [] };
      stages[m[2] || `#${Object.keys(stages).length}`] = stage;
    } else {
      assert.ok(stage, `${instr} before FROM`);
      stage.lines.push([instr.toUpperCase(), arg]);
    }
  }
  return stages;
}
function checkDockerfile() {
  const file = path.join(ROOT, "helm/images/Dockerfile");
  let stages;
  check("images/Dockerfile parses; stages build, controller, agent, trainer on Debian bookworm", () => {
    stages = parseDockerfile(file);
    for (const s of ["build", "controller", "agent", "trainer"]) assert.ok(stages[s], `stage ${s}`);
    for (const [name, s] of Object.entries(stages)) {
      assert.match(s.base, /^(debian:bookworm(-slim)?|build|runtime)(@sha256:[0-9a-f]+)?$/, `${name}: FROM ${s.base}`);
    }
  });
  if (!stages) return;
  check("images/Dockerfile: every COPY source from the context exists", () => {
    for (const [name, s] of Object.entries(stages)) {
      for (const [instr, arg] of s.lines) {
        if (instr !== "COPY" && instr !== "ADD") continue;
        if (/--from=/.test(arg)) continue;
        const parts = arg.split(/\s+/).filter((p) => !p.startsWith("--"));
        for (const src of parts.slice(0, -1)) {
          assert.ok(fs.existsSync(path.join(ROOT, src)), `${name}: COPY ${src}: not in the repository`);
        }
      }
    }
  });
  check("images/Dockerfile: the entrypoints are the binaries the chart runs, copied from the build", () => {
    const objs = render({ "agent.cpu.enabled": true });
    const want = {
      controller: one(objs, "Deployment").spec.template.spec.containers[0].command[0],
      agent: one(objs, "DaemonSet", (d) => d.metadata.name.endsWith("-gpu")).spec.template.spec.containers[0].command[0],
    };
    assert.equal(one(objs, "DaemonSet", (d) => d.metadata.name.endsWith("-cpu")).spec.template.spec.containers[0].command[0], want.agent);
    const testPodCmd = one(objs, "Pod").spec.containers[0].args[0];
    assert.match(testPodCmd, /\btributary --controller/);
    const buildTargets = stages.build.lines.filter(([i]) => i === "RUN").map(([, a]) => a).join(" ");
    for (const [stage, binary] of Object.entries(want)) {
      const s = stages[stage];
      const entry = s.lines.filter(([i]) => i === "ENTRYPOINT").pop();
      assert.ok(entry, `${stage}: no ENTRYPOINT`);
      assert.deepEqual(JSON.parse(entry[1]), [binary], `${stage}: ENTRYPOINT`);
      const copies = s.lines.filter(([i, a]) => i === "COPY" && a.includes("--from=build")).map(([, a]) => a).join(" ");
      const needed = stage === "controller" ? [binary, "tributary"] : [binary];  // the helm test pod runs the CLI
      for (const b of needed) {
        assert.ok(new RegExp(`/bin/${b}(\\s|$)`).test(copies), `${stage}: ${b} not copied from the build stage`);
        assert.ok(new RegExp(`(\\s|^)${b}(\\s|$)`).test(buildTargets), `build: ${b} not among the built targets`);
      }
    }
    const user = stages.controller.lines.filter(([i]) => i === "USER").pop();
    assert.ok(user && user[1] === "10001:10001", "controller: USER 10001:10001 (the chart's runAsUser)");
  });
}

// --- flags: the binaries with the rendered args ------------------------------------------------
// A port the chart's fixed-port flags can take: free now, and below the kernel's ephemeral range,
// so no bind to port 0 (the agent's data plane, other tests) can be handed it before the
// binaries bind it. listen(0) would pick from that range: another process could get the same
// port between its close here and the binary's bind (seen once in CI as the agent's data plane
// taking the port chosen for its /metrics).
function ephemeralLow() {
  try {
    const low = Number(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 2048 ? low : 32768;
  } catch {
    return 32768;
  }
}
const pickedPorts = new Set();
async function freePort() {
  const low = Math.min(ephemeralLow(), 65536);
  const from = Math.max(1024, low - 20000);
  for (let attempt = 0; attempt < 200; ++attempt) {
    const port = from + Math.floor(Math.random() * (low - from));
    if (pickedPorts.has(port)) continue;
    const ok = await new Promise((resolve) => {
      const s = net.createServer();
      s.once("error", () => resolve(false));
      s.listen(port, "0.0.0.0", () => s.close(() => resolve(true)));
    });
    if (ok) {
      pickedPorts.add(port);
      return port;
    }
  }
  throw new Error(`no free port in [${from}, ${low})`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function substituteEnv(argv, env) {
  return argv.map((a) => a.replace(/\$\(([A-Z_]+)\)/g, (_, k) => {
    assert.ok(k in env, `$(${k}) has no value`);
    return env[k];
  }));
}
function containerEnv(container, fieldValues) {
  const env = {};
  for (const e of container.env || []) {
    env[e.name] = e.value ?? fieldValues[e.valueFrom?.fieldRef?.fieldPath];
    assert.ok(env[e.name] !== undefined, `env ${e.name}: no value`);
  }
  return env;
}
function start(binDir, container, env, log) {
  const [cmd, ...rest] = container.command;
  const exe = path.join(binDir, cmd);
  assert.ok(fs.existsSync(exe), `${exe} is not built`);
  const argv = substituteEnv([...rest, ...container.args], env);
  console.log(`     ${cmd} ${argv.join(" ")}`);
  const out = fs.openSync(log, "w");
  const child = spawn(exe, argv, { env: { ...process.env, ...env }, stdio: ["ignore", out, out] });
  child.exitStatus = null;
  child.on("exit", (code, signal) => { child.exitStatus = code ?? signal; });
  return child;
}
async function waitFor(what, fn, child, log, ms = 15000) {
  for (const end = Date.now() + ms; Date.now() < end;) {
    if (child.exitStatus !== null) {
      throw new Error(`${what}: the process exited (${child.exitStatus}):\n${fs.readFileSync(log, "utf8")}`);
    }
    if (await fn()) return;
    await sleep(100);
  }
  throw new Error(`${what}: not within ${ms} ms:\n${fs.readFileSync(log, "utf8")}`);
}
const canConnect = (port) => new Promise((resolve) => {
  const s = net.connect(port, "127.0.0.1", () => { s.destroy(); resolve(true); });
  s.on("error", () => resolve(false));
});

// grpc.health.v1.Health/Check as kubelet's gRPC probe sends it: HealthCheckRequest{service: ""}
// (an empty message); the answer's status field (1, varint) must be SERVING (1).
function healthCheck(port) {
  const grpc = require("@grpc/grpc-js");
  const Client = grpc.makeGenericClientConstructor({
    Check: {
      path: "/grpc.health.v1.Health/Check", requestStream: false, responseStream: false,
      requestSerialize: () => Buffer.alloc(0), requestDeserialize: (b) => b,
      responseSerialize: (b) => b, responseDeserialize: (b) => b,
    },
  }, "Health");
  const client = new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  return new Promise((resolve, reject) => {
    client.Check({}, { deadline: Date.now() + 3000 }, (err, reply) => {
      client.close();
      if (err) return reject(new Error(`grpc.health.v1.Health/Check on port ${port}: ${err.message}`));
      resolve(reply.length === 2 && reply[0] === 0x08 ? ["UNKNOWN", "SERVING", "NOT_SERVING"][reply[1]] ?? reply[1]
        : reply.length === 0 ? "UNKNOWN" : `undecodable ${reply.toString("hex")}`);
    });
  });
}

// The same Health/Check over mTLS with the PEM files in `dir` (tls.crt, tls.key, ca.crt).
function healthCheckTls(port, dir) {
  const grpc = require("@grpc/grpc-js");
  const Client = grpc.makeGenericClientConstructor({
    Check: {
      path: "/grpc.health.v1.Health/Check", requestStream: false, responseStream: false,
      requestSerialize: () => Buffer.alloc(0), requestDeserialize: (b) => b,
      responseSerialize: (b) => b, responseDeserialize: (b) => b,
    },
  }, "Health");
  const read = (f) => fs.readFileSync(path.join(dir, f));
  const client = new Client(`127.0.0.1:${port}`,
    grpc.credentials.createSsl(read("ca.crt"), read("tls.key"), read("tls.crt")));
  return new Promise((resolve, reject) => {
    client.Check({}, { deadline: Date.now() + 3000 }, (err, reply) => {
      client.close();
      if (err) return reject(new Error(`mTLS grpc.health.v1.Health/Check on port ${port}: ${err.message}`));
      resolve(reply.length === 2 && reply[0] === 0x08 && reply[1] === 1 ? "SERVING" : reply.toString("hex"));
    });
  });
}

// The Secret the chart mounts, made with openssl in `dir`: one certificate for every role (the
// agents' identity, naming 127.0.0.1 for the controller), as tls.crt / tls.key / ca.crt.
function makeTlsSecret(dir, identity) {
  fs.mkdirSync(dir, { recursive: true });
  const ossl = (...a) => execFileSync("openssl", a, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  ossl("req", "-x509", ...ec, "-days", "1", "-subj", "/CN=helm-test-ca", "-keyout", "ca.key", "-out", "ca.crt");
  fs.writeFileSync(path.join(dir, "ext.cnf"),
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n");
  ossl("req", "-new", ...ec, "-subj", `/CN=${identity}`, "-keyout", "tls.key", "-out", "tls.csr");
  ossl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
    "-extfile", "ext.cnf", "-out", "tls.crt");
}

async function checkFlags(binDir, persistence, tls = false) {
  for (const b of ["tributary-controller", "tributary-agent", "tributary"]) {
    if (!fs.existsSync(path.join(binDir, b))) {
      console.log(`FAIL ${path.join(binDir, b)} is not built (ninja -C build tributary-controller tributary-agent tributary)`);
      process.exit(1);
    }
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tributary-helm-flags-"));
  const [grpc, cmetrics, ametrics] = [await freePort(), await freePort(), await freePort()];
  const set = {
    "controller.grpcPort": grpc, "controller.metricsPort": cmetrics, "agent.metricsPort": ametrics,
    "agent.socketDir": path.join(tmp, "run"), "agent.controllerAddress": `127.0.0.1:${grpc}`,
    "agent.ucx": { netDevices: "lo", tls: "tcp" }, "agent.gpu.summation": false, "agent.nicGbps": 1,
    "controller.persistence.enabled": persistence,
  };
  if (persistence) set["controller.persistence.mountPath"] = path.join(tmp, "state");
  if (tls) {
    Object.assign(set, { "tls.enabled": true, "tls.secretName": "tributary-tls", "tls.mountPath": path.join(tmp, "tls"),
      "tls.reloadSeconds": 1 });
    makeTlsSecret(set["tls.mountPath"], "tributary-agent");
  }
  const objs = render(set);
  const controller = one(objs, "Deployment").spec.template.spec.containers[0];
  const agent = one(objs, "DaemonSet").spec.template.spec.containers[0];
  const testPod = one(objs, "Pod").spec.containers[0];
  if (persistence) {
    const help = execFileSync(path.join(binDir, "tributary-controller"), ["--help"], { encoding: "utf8" });
    if (!help.includes("--state-db")) {
      console.log("SKIPPED: this tributary-controller has no --state-db (it comes with branch ctl-durable)");
      process.exit(77);
    }
    fs.mkdirSync(set["controller.persistence.mountPath"], { recursive: true });
  }
  fs.mkdirSync(set["agent.socketDir"], { recursive: true });
  const children = [];
  try {
    const clog = path.join(tmp, "controller.log");
    const c = start(binDir, controller, containerEnv(controller, {}), clog);
    children.push(c);
    await waitFor("controller serving on the rendered --listen port", () => canConnect(grpc), c, clog);
    await waitFor("controller /metrics on the rendered port", () => canConnect(cmetrics), c, clog);
    if (tls) {
      const probePort = controller.readinessProbe.tcpSocket.port;
      const plaintext = await healthCheck(probePort).then((h) => h, (e) => e.message);
      const secured = await healthCheckTls(grpc, set["tls.mountPath"]);
      check(`with mTLS: the chart's TCP probe port is --listen's, a plaintext Health/Check is refused, an mTLS one answers SERVING`, () => {
        assert.equal(probePort, grpc);
        assert.notEqual(plaintext, "SERVING");
        assert.match(plaintext, /UNAVAILABLE|failed|closed/i, plaintext);
        assert.equal(secured, "SERVING");
      });
    } else {
      const probePort = controller.readinessProbe.grpc.port;
      const health = await healthCheck(probePort);
      check(`the chart's gRPC probe (grpc.health.v1 on port ${probePort}) answers SERVING`, () => {
        assert.equal(probePort, grpc);
        assert.equal(health, "SERVING");
      });
    }

    // The helm test pod's script, with the binaries on PATH, against the controller.
    const runTestPod = () => spawnSync(testPod.command[0], [...testPod.command.slice(1), ...testPod.args], {
      encoding: "utf8", env: { ...process.env, ...containerEnv(testPod, {}), PATH: `${binDir}:${process.env.PATH}` },
    });
    const before = runTestPod();
    check("helm test pod fails while no agent is registered", () => {
      assert.notEqual(before.status, 0, before.stdout);
      assert.match(before.stderr, /no agent is registered and alive/);
    });

    const alog = path.join(tmp, "agent.log");
    const a = start(binDir, agent, containerEnv(agent, { "spec.nodeName": "helm-flags-node", "status.podIP": "127.0.0.1" }), alog);
    children.push(a);
    await waitFor("agent /metrics on the rendered port", () => canConnect(ametrics), a, alog);
    await waitFor("agent socket at the rendered --listen path",
      () => fs.existsSync(path.join(set["agent.socketDir"], "agent.sock")), a, alog);
    let last;
    await waitFor("the helm test pod passes once the agent registered", () => {
      last = runTestPod();
      return last.status === 0;
    }, a, alog);
    check("helm test pod passes with the agent registered; the node is the rendered --node-id", () => {
      assert.match(last.stdout, /helm-flags-node\s+alive/);
    });
    if (tls) {
      const plain = spawnSync(path.join(binDir, "tributary"), ["--controller", `127.0.0.1:${grpc}`, "nodes"], { encoding: "utf8" });
      check("with mTLS: the CLI without the test pod's --tls-* flags is refused, and says which flags to pass", () => {
        assert.notEqual(plain.status, 0, plain.stdout);
        assert.match(plain.stderr, /pass --tls-cert, --tls-key and --tls-ca/);
      });
    }
    check("controller and agent still running with the rendered args", () => {
      assert.equal(c.exitStatus, null, fs.readFileSync(clog, "utf8"));
      assert.equal(a.exitStatus, null, fs.readFileSync(alog, "utf8"));
    });
  } catch (e) {
    check("the binaries start with the rendered args", () => { throw e; });
  } finally {
    for (const ch of children.reverse()) if (ch.exitStatus === null) ch.kill("SIGTERM");
    await sleep(300);
    for (const ch of children) if (ch.exitStatus === null) ch.kill("SIGKILL");
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

if (MODE === "chart") {
  checkChart();
} else if (MODE === "flags" || MODE === "flags-persistence" || MODE === "flags-tls") {
  assert.ok(BIN_DIR, "flags needs BIN_DIR");
  await checkFlags(path.resolve(BIN_DIR), MODE === "flags-persistence", MODE === "flags-tls");
} else {
  console.error("usage: check_chart.mjs --helm HELM --modules DIR chart|flags BIN_DIR|flags-persistence BIN_DIR|flags-tls BIN_DIR");
  process.exit(2);
}
if (failures) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log("all checks passed");
