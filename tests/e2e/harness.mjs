// Shared pieces of the browser tests: a static server for dist/ on a free
// localhost port (under a sub-path, to prove the site works from one), the
// system Chromium driven by playwright-core, and fixture lookup.

import { createServer } from "node:http";
import { readFile, stat, mkdir, mkdtemp } from "node:fs/promises";
import { existsSync, readdirSync, readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { gunzipSync, inflateRawSync } from "node:zlib";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const DIST = path.join(ROOT, "dist");
export const SHOTS = path.join(ROOT, "target", "e2e");
export const SHARED = process.env.MEMCAST_SHARED ?? path.resolve(ROOT, "..", "shared");
export const SUB_PATH = "/team/tools/memcast/";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript",
  ".wasm": "application/wasm",
  ".css": "text/css",
  ".svg": "image/svg+xml",
  ".json": "application/json",
  ".gz": "application/gzip",
};

/**
 * A real fixture from ../shared/fixtures/FOLDER (`traces` by default);
 * throws with the path it tried when missing.
 */
export function fixture(name, folder = "traces") {
  const file = path.join(SHARED, "fixtures", folder, name);
  if (!existsSync(file)) {
    throw new Error(`missing shared fixture ${file}: the tests need ../shared beside the checkout`);
  }
  return file;
}

/**
 * A plain JSON trace of the t5-small fixture's events `copies` times over,
 * written to a temporary file: a job long enough to cancel in the middle.
 */
export function longTrace(copies) {
  const text = gunzipSync(readFileSync(fixture("t5-small_adamw_bs8_pos1.json.gz"))).toString("utf8");
  const events = text.slice(text.indexOf("[", text.indexOf('"traceEvents"')) + 1, text.lastIndexOf("]"));
  const file = path.join(mkdtempSync(path.join(tmpdir(), "memcast-long-")), "long.json");
  writeFileSync(file, `{"traceEvents": [${Array(copies).fill(events).join(",")}]}`);
  return file;
}

/** The worker's WebAssembly, which it fetches before it can say "ready". */
export const WORKER_WASM_PATH = "worker_bg.wasm";

/**
 * Serves dist/ under SUB_PATH on 127.0.0.1 and a free port; returns { origin, url, close }.
 *
 * `slowWorkerMs` holds each worker's request for its WebAssembly that long,
 * so the worker is not ready for that long after the page has loaded — a
 * slow network or a busy laptop, on purpose. Only the workers' requests are
 * held (their referrer is the worker's loader script). Nothing in the
 * product changes.
 */
export async function serveDist({ slowWorkerMs = 0 } = {}) {
  if (!existsSync(path.join(DIST, "index.html"))) {
    throw new Error(`no ${DIST}/index.html: run \`trunk build --release\` first`);
  }
  const server = createServer(async (req, res) => {
    const url = new URL(req.url, "http://localhost");
    if (!url.pathname.startsWith(SUB_PATH)) {
      res.writeHead(404).end("outside the app's sub-path");
      return;
    }
    let relative = decodeURIComponent(url.pathname.slice(SUB_PATH.length)) || "index.html";
    if (slowWorkerMs > 0 && relative === WORKER_WASM_PATH && /worker_loader\.js$/.test(req.headers.referer ?? "")) {
      await new Promise((resolve) => setTimeout(resolve, slowWorkerMs));
    }
    const file = path.join(DIST, relative);
    if (!file.startsWith(DIST)) {
      res.writeHead(403).end();
      return;
    }
    try {
      const info = await stat(file);
      const body = await readFile(info.isDirectory() ? path.join(file, "index.html") : file);
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] ?? "application/octet-stream" });
      res.end(body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  const origin = `http://127.0.0.1:${port}`;
  return { origin, url: origin + SUB_PATH, close: () => new Promise((r) => server.close(r)) };
}

/** Launches the system Chromium headless with a fresh profile. */
export async function launchBrowser() {
  const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
  if (!existsSync(executablePath)) {
    throw new Error(`no Chromium at ${executablePath}: install Debian's chromium (bash .ci/setup.sh --browser)`);
  }
  const profile = await mkdtemp(path.join(tmpdir(), "memcast-chromium-"));
  return chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

/** Records every request a page makes, to prove nothing leaves the origin. */
export function recordRequests(page) {
  const urls = [];
  page.on("request", (request) => urls.push(request.url()));
  return urls;
}

/** Saves a screenshot under target/e2e/ for people to look at. */
export async function screenshot(page, name) {
  await mkdir(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

/** The names of the CPU trace fixtures in ../shared/fixtures/FOLDER (`traces` by default), sorted; throws if none. */
export function allFixtures(folder = "traces") {
  const dir = path.join(SHARED, "fixtures", folder);
  if (!existsSync(dir)) {
    throw new Error(`missing shared fixtures folder ${dir}`);
  }
  const names = readdirSync(dir).filter((n) => n.endsWith(".json.gz")).sort();
  if (names.length === 0) {
    throw new Error(`no fixtures in ${dir}`);
  }
  return names;
}

/** The native CLI: $MEMCAST_CLI, or the debug build that `cargo test` leaves. */
export function cli() {
  const bin = process.env.MEMCAST_CLI ?? path.join(ROOT, "target", "debug", "memcast");
  if (!existsSync(bin)) {
    throw new Error(`no CLI at ${bin}: run \`cargo build\` (or set MEMCAST_CLI)`);
  }
  return bin;
}

/** `memcast estimate --json` on a file (with `--gpu` for each of `gpus`, if given), parsed. */
export function cliEstimate(file, gpus = []) {
  const args = ["estimate", "--json", file, ...gpus.flatMap((g) => ["--gpu", g])];
  return JSON.parse(execFileSync(cli(), args, { encoding: "utf8", maxBuffer: 64 << 20 }));
}

/** Opens the app and waits until its worker has said "ready". */
export async function openApp(browser, url) {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (err) => problems.push(String(err)));
  const requests = recordRequests(page);
  await page.goto(url);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  return { page, problems, requests };
}

/** The report JSON the page shows (its details opened first), parsed. */
export async function reportJson(page) {
  if (!(await page.locator("#report-json-details").evaluate((d) => d.open))) {
    await page.click("#report-json-details summary");
  }
  return JSON.parse(await page.inputValue("#report-json"));
}

/** The fragment of a permalink, decoded (`#e=v2.` + base64url(deflate(json))). */
export function decodeLink(link) {
  const fragment = link.slice(link.indexOf("#") + 1);
  assert.ok(fragment.startsWith("e=v2."), link);
  return JSON.parse(inflateRawSync(Buffer.from(fragment.slice("e=v2.".length), "base64url")).toString("utf8"));
}

/** `--gpu` for each GPU of a report, in its order (the page's default selection). */
export function gpuArgs(report) {
  return report.gpus.map((g) => g.preset).flatMap((g) => ["--gpu", g]);
}

/** The digits of a "1,234 B" text as a number. */
export function bytesOf(text) {
  return Number(text.replace(/[^0-9]/g, ""));
}

/** `memcast ARGS...` (the CLI above), its standard output as text. */
export function cliRun(args) {
  return execFileSync(cli(), args, { encoding: "utf8", maxBuffer: 64 << 20 });
}

/** Drops `file` (a path) on the drop zone as a user would: dragover, then drop. */
export async function dropFile(page, file, name = path.basename(file)) {
  await dropFiles(page, [file], [name]);
}

/** Drops several `files` (paths) together on the drop zone, in order: one drag of all of them. */
export async function dropFiles(page, files, names = files.map((f) => path.basename(f))) {
  const items = await Promise.all(
    files.map(async (file, i) => ({ base64: (await readFile(file)).toString("base64"), name: names[i] })),
  );
  const transfer = await page.evaluateHandle((items) => {
    const dt = new DataTransfer();
    for (const { base64, name } of items) {
      const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
      dt.items.add(new File([bytes], name));
    }
    return dt;
  }, items);
  await page.dispatchEvent("#drop-zone", "dragover", { dataTransfer: transfer });
  await page.dispatchEvent("#drop-zone", "drop", { dataTransfer: transfer });
}

/**
 * Records, from the first script on every page of `page`, each text the
 * status line shows and when each worker said "ready" (performance.now()
 * times), in `window.__startup`; `startupLog(page)` reads it back.
 */
export async function recordStartup(page) {
  await page.addInitScript(() => {
    const log = (window.__startup = { status: [], ready: [], workers: 0 });
    const Original = window.Worker;
    window.Worker = class extends Original {
      constructor(...args) {
        super(...args);
        log.workers += 1;
        this.addEventListener("message", (event) => {
          if (event.data === '{"kind":"ready"}') log.ready.push(performance.now());
        });
      }
    };
    const seen = () => {
      const text = document.querySelector("#status")?.textContent ?? null;
      if (text !== log.last) {
        log.last = text;
        log.status.push([performance.now(), text]);
      }
    };
    new MutationObserver(seen).observe(document, { subtree: true, childList: true, characterData: true });
  });
}

/** What `recordStartup` saw so far, plus the page's clock now. */
export function startupLog(page) {
  return page.evaluate(() => ({ ...window.__startup, now: performance.now() }));
}
