// Drop-to-result in the browser against the native CLI, measured in the same
// run on the same machine (issues 6 and 8), and the sizes of issue 33.
//
//   trunk build --release && cargo build --release --bin memcast
//   node benches/browser.mjs [FILE...]      # default: the largest fixture
//   node benches/browser.mjs --scale        # issue 33's cases (see scaleBench)
//   MEMCAST_SCALE_CASES=train-L160,drop-2MB-at-load node benches/browser.mjs --scale
//
// For each file: a fresh page (worker started and settled for a second,
// nothing dropped yet), the file set on the picker, the time until its result
// is on the page ("cold"), then another file and the same file again in the
// same page ("warm"); the progress bar's values
// while it worked; and `memcast estimate --json` (release build) with the GPUs
// the page simulated, best of three. Prints a Markdown table.

import { execFileSync } from "node:child_process";
import { statSync, existsSync } from "node:fs";
import path from "node:path";
import { serveDist, launchBrowser, openApp, allFixtures, fixture, ROOT } from "../tests/e2e/harness.mjs";

const cliPath = process.env.MEMCAST_CLI ?? path.join(ROOT, "target", "release", "memcast");
if (!existsSync(cliPath)) {
  throw new Error(`no release CLI at ${cliPath}: run \`cargo build --release --bin memcast\``);
}

if (process.argv.includes("--scale")) {
  await scaleBench();
  process.exit(0);
}

let files = process.argv.slice(2);
if (files.length === 0) {
  const largest = allFixtures()
    .map((name) => fixture(name))
    .sort((a, b) => statSync(b).size - statSync(a).size)[0];
  files = [largest];
}

/**
 * Drops `file` and resolves with { ms, worker, progress }: the time from the
 * input's change event to the result's name on the page (a MutationObserver
 * in the page, so the test driver's polling does not count), the part of it
 * the worker took, and the progress bar's values seen meanwhile.
 */
async function drop(page, file) {
  const name = path.basename(file);
  await page.evaluate((name) => {
    window.__drop = { progress: [] };
    const drop = window.__drop;
    document.addEventListener("change", () => { drop.change ??= performance.now(); }, { capture: true, once: true });
    drop.observer = new MutationObserver(() => {
      const shown = document.querySelector("#trace-name");
      if (drop.shown === undefined && drop.change !== undefined && shown?.textContent.includes(name)) {
        drop.shown = performance.now();
      }
    });
    drop.observer.observe(document.body, { subtree: true, childList: true, characterData: true });
    drop.poll = setInterval(() => {
      const bar = document.querySelector("#progress");
      if (bar) drop.progress.push(Number(bar.value));
    }, 20);
  }, name);
  await page.setInputFiles("#file-input", file);
  await page.waitForFunction(() => window.__drop.shown !== undefined, null, { timeout: 600_000, polling: 100 });
  const { ms, worker, progress } = await page.evaluate(() => {
    const drop = window.__drop;
    clearInterval(drop.poll);
    drop.observer.disconnect();
    const run = window.__runs[window.__runs.length - 1];
    const worker = run && run.done !== undefined ? run.done - run.posted : NaN;
    return { ms: drop.shown - drop.change, worker, progress: drop.progress };
  });
  return { ms, worker: worker / 1000, progress };
}

function nativeSeconds(file, gpus) {
  const args = ["estimate", "--json", file, ...gpus.flatMap((g) => ["--gpu", g])];
  let best = Infinity;
  for (let i = 0; i < 3; i++) {
    const started = process.hrtime.bigint();
    execFileSync(cliPath, args, { maxBuffer: 256 << 20 });
    best = Math.min(best, Number(process.hrtime.bigint() - started) / 1e9);
  }
  return best;
}

const site = await serveDist();
const browser = await launchBrowser();
// Times the worker from the page's side: when a run request is posted and
// when its result comes back, so the table can split drop-to-result into
// the worker's part and the page's (decoding and drawing).
await browser.addInitScript(() => {
  window.__runs = [];
  const Original = window.Worker;
  window.Worker = class extends Original {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        if (typeof event.data === "string" && event.data.startsWith('{"kind":"done"')) {
          const run = window.__runs[window.__runs.length - 1];
          if (run && run.done === undefined) run.done = performance.now();
        }
      });
    }
    postMessage(message, ...rest) {
      if (message && typeof message.request === "string" && message.request.startsWith('{"kind":"run"')) {
        window.__runs.push({ posted: performance.now() });
      }
      return super.postMessage(message, ...rest);
    }
  };
});
const rows = [];
try {
  for (const file of files) {
    const { page } = await openApp(browser, site.url);
    // Let the worker settle as a user's page would before a drop.
    await page.waitForTimeout(1000);
    const cold = await drop(page, file);
    // Another file in between, so that the page shows a new result for the
    // second drop of `file`.
    await drop(page, fixture(path.basename(file).startsWith("resnet18_sgd_bs16") ? "mobilenet_v2_sgd_bs16_pos0.json.gz" : "resnet18_sgd_bs16_pos1.json.gz"));
    const warm = await drop(page, file);
    await page.click("#report-json-details summary");
    const report = JSON.parse(await page.inputValue("#report-json"));
    const gpus = report.gpus.map((g) => g.preset);
    await page.close();
    const native = nativeSeconds(file, gpus);
    const moved = new Set(cold.progress.filter((v) => v > 0 && v < 100)).size;
    rows.push(
      `| ${path.basename(file)} | ${(statSync(file).size / 1e6).toFixed(1)} | ${native.toFixed(3)} | ` +
        `${(cold.ms / 1000).toFixed(3)} | ${(cold.ms / 1000 / native).toFixed(2)} | ` +
        `${(warm.ms / 1000).toFixed(3)} | ${(warm.ms / 1000 / native).toFixed(2)} | ` +
        `${cold.worker.toFixed(3)} | ${warm.worker.toFixed(3)} | ${moved} |`,
    );
  }
} finally {
  await browser.close();
  await site.close();
}
console.log("| file | MB on disk | native s | browser cold s | cold / native | browser warm s | warm / native | worker s (cold) | worker s (warm) | progress values seen |");
console.log("|---|---|---|---|---|---|---|---|---|---|");
for (const row of rows) console.log(row);

/**
 * Issue 33's sizes in the browser (`--scale`): each case in a fresh page —
 * the generate fixture rebuilt at 32 layers × 1,024 new tokens and at 80 ×
 * 32,768, the longest generation at 80 layers, the training fixture at 160
 * layers, and a 2 MB trace dropped right after the page loads (before its
 * worker is ready). For each: how it ended (a result, the core's refusal,
 * a worker that died, a timeout), the time from the click (or the drop) to
 * that, the progress values seen, whether Cancel stops the same run after
 * a second and the worker answers again, and the CLI's time for the same
 * request with the same GPUs (`MEMCAST_SCALE_TIMEOUT_S` bounds each, 300 s).
 */
async function scaleBench() {
  const limitMs = Number(process.env.MEMCAST_SCALE_TIMEOUT_S ?? 300) * 1000;
  const gen = fixture("llama_gen16_dynamic.json.gz", "traces-llm");
  const train = fixture("llama-small_adamw_bs4_seq128_L2.json.gz", "traces-depth");
  const cases = [
    { name: "gen-L32-1024", file: gen, layers: 32, tokens: 1024 },
    { name: "gen-L80-32768", file: gen, layers: 80, tokens: 32768 },
    { name: "context-L80", file: gen, layers: 80, context: true },
    { name: "train-L160", file: train, layers: 160 },
    { name: "drop-2MB-at-load", file: fixture("bert-base-cls_adamw_bs16_pos0.json.gz"), atLoad: true },
  ].filter((c) => !process.env.MEMCAST_SCALE_CASES || process.env.MEMCAST_SCALE_CASES.split(",").includes(c.name));
  const site = await serveDist();
  const browser = await launchBrowser();
  // Worker errors (an abort or an out-of-memory trap kills the worker; the
  // page hears only an "error" event) and the worker's runs, per page.
  await browser.addInitScript(() => {
    window.__workerErrors = [];
    const Original = window.Worker;
    window.Worker = class extends Original {
      constructor(...args) {
        super(...args);
        this.addEventListener("error", (e) => window.__workerErrors.push(String(e.message ?? e.type)));
      }
    };
  });
  const rows = [];
  try {
    for (const c of cases) {
      const page = await browser.newPage();
      const problems = [];
      page.on("pageerror", (err) => problems.push(String(err)));
      let run;
      if (c.atLoad) {
        await page.goto(site.url);
        const t = await timed(page, () => page.setInputFiles("#file-input", c.file), path.basename(c.file), limitMs);
        run = t;
      } else {
        await page.goto(site.url);
        await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
        await page.setInputFiles("#file-input", c.file);
        await page.locator("#trace-name", { hasText: path.basename(c.file) }).waitFor({ timeout: 120_000 });
        await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
        // A user reads the traced job's result before asking for another
        // size (the worker warms up a rebuild from 0.25 s after a result;
        // MEMCAST_SCALE_READ_MS=0 asks at once, as this bench did before).
        await page.waitForTimeout(Number(process.env.MEMCAST_SCALE_READ_MS ?? 1000));
        await page.fill("#layers", String(c.layers));
        if (c.tokens) await page.fill("#new-tokens", String(c.tokens));
        if (c.context) {
          // The job at that depth first; then the search, timed.
          await page.click("#scale-apply");
          await page.locator("#scaled-note").waitFor({ timeout: limitMs });
          await untilReady(page, limitMs);
        }
        run = await timed(page, () => page.click(c.context ? "#whatif-context" : "#scale-apply"), null, limitMs);
      }
      console.error(`${c.name}: ${run.status} in ${(run.ms / 1000).toFixed(2)} s`);
      // Cancel: the same request again, cancelled after a second.
      let cancel = "-";
      if (!c.atLoad && run.ms > 2000 && run.status !== "worker died") {
        await page.reload();
        await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
        await page.setInputFiles("#file-input", c.file);
        await page.locator("#trace-name", { hasText: path.basename(c.file) }).waitFor({ timeout: 120_000 });
        // The page keeps its settings across the reload: the file may run
        // at the case's size already.
        await untilReady(page, limitMs);
        await page.fill("#layers", String(c.layers));
        if (c.tokens) await page.fill("#new-tokens", String(c.tokens));
        await page.click("#scale-apply");
        if (c.context) { await untilReady(page, limitMs); await page.click("#whatif-context"); }
        await page.waitForTimeout(1000);
        const started = Date.now();
        try {
          await page.click("#cancel", { timeout: 5_000 });
          await page.locator("#error", { hasText: "cancelled" }).waitFor({ timeout: 10_000 });
          await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
          cancel = `stopped, ready again in ${((Date.now() - started) / 1000).toFixed(1)} s`;
        } catch (err) {
          cancel = `did not stop: ${String(err).split("\n")[0]}`;
        }
      }
      const report = run.status === "result" && !c.context ? await reportOf(page) : null;
      const gpus = report ? report.gpus.map((g) => g.preset) : ["a100-80gb"];
      const args = c.atLoad
        ? ["estimate", "--json", c.file]
        : c.context
          ? ["whatif", "context", "--json", c.file, "--layers", String(c.layers)]
          : ["estimate", "--json", c.file, "--layers", String(c.layers), ...(c.tokens ? ["--new-tokens", String(c.tokens)] : [])];
      const native = nativeRun([...args, ...gpus.flatMap((g) => ["--gpu", g])], limitMs);
      const errors = await page.evaluate(() => window.__workerErrors);
      await page.close();
      const ratio = run.status === "result" && native.seconds ? (run.ms / 1000 / native.seconds).toFixed(2) : "-";
      const peak = report ? report.peak.reserved_bytes : "-";
      rows.push(
        `| ${c.name} | ${run.status}${run.detail ? `: ${run.detail}` : ""} | ${(run.ms / 1000).toFixed(2)} | ${native.status} | ` +
          `${native.seconds ? native.seconds.toFixed(2) : "-"} | ${ratio} | ${peak} | ${run.progress} | ${cancel} | ` +
          `${errors.length + problems.length === 0 ? "none" : [...errors, ...problems].join("; ").slice(0, 120)} |`,
      );
      console.error(rows[rows.length - 1]);
    }
  } finally {
    await browser.close();
    await site.close();
  }
  console.log("| case | browser | browser s | native | native s | browser / native | peak reserved B (page) | progress values seen | Cancel after 1 s | worker or page errors |");
  console.log("|---|---|---|---|---|---|---|---|---|---|");
  for (const row of rows) console.log(row);
}

/** Waits until the status line says "Ready." (after a run started). */
async function untilReady(page, limitMs) {
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: limitMs });
}

/**
 * Runs `act` and times, inside the page, until the run it starts ends: the
 * status line back at "Ready." with a result (or the file `name` on the
 * page), an error shown, or the worker dead (its "error" event). Resolves
 * with { status, detail, ms, progress }. A file set on the picker is timed
 * from the input's change event, as `drop` times it (the driver takes a
 * few hundred ms to hand the file to the page, which is not the page's
 * time); anything else from just before `act`.
 */
async function timed(page, act, name, limitMs) {
  await page.evaluate((name) => {
    const run = (window.__run = { progress: new Set(), name });
    document.addEventListener("change", () => { run.change ??= performance.now(); }, { capture: true, once: true });
    const errorsBefore = window.__workerErrors.length;
    const before = document.querySelector("#error")?.textContent ?? null;
    run.poll = setInterval(() => {
      const now = performance.now();
      run.start ??= now;
      const bar = document.querySelector("#progress");
      if (bar) { run.busy = true; if (bar.value) run.progress.add(Number(bar.value)); }
      const status = document.querySelector("#status")?.textContent ?? "";
      const error = document.querySelector("#error")?.textContent ?? null;
      if (window.__workerErrors.length > errorsBefore) {
        run.end = { status: "worker died", detail: window.__workerErrors[window.__workerErrors.length - 1], at: now };
      } else if (error && error !== before) {
        run.end = { status: "refused", detail: error, at: now };
      } else if (status === "Ready." && (name ? document.querySelector("#trace-name")?.textContent.includes(name) : run.busy)) {
        run.end = { status: "result", at: now };
      }
      if (run.end) clearInterval(run.poll);
    }, 10);
  }, name);
  const t0 = await page.evaluate(() => performance.now());
  await act();
  try {
    await page.waitForFunction(() => window.__run.end !== undefined, null, { timeout: limitMs, polling: 100 });
  } catch {
    await page.evaluate(() => clearInterval(window.__run.poll));
    return { status: "timeout", ms: limitMs, progress: "-" };
  }
  const end = await page.evaluate(() => ({ ...window.__run.end, change: window.__run.change, progress: window.__run.progress.size }));
  const from = name && end.change !== undefined ? end.change : t0;
  return { status: end.status, detail: end.detail, ms: end.at - from, progress: end.progress };
}

/** The report JSON on the page. */
async function reportOf(page) {
  if (!(await page.locator("#report-json-details").evaluate((d) => d.open))) {
    await page.click("#report-json-details summary");
  }
  return JSON.parse(await page.inputValue("#report-json"));
}

/** `memcast ARGS` once, timed, within `limitMs`: { status, seconds }. */
function nativeRun(args, limitMs) {
  const started = process.hrtime.bigint();
  try {
    execFileSync(cliPath, args, { maxBuffer: 256 << 20, timeout: limitMs, stdio: ["ignore", "ignore", "pipe"] });
    return { status: "result", seconds: Number(process.hrtime.bigint() - started) / 1e9 };
  } catch (err) {
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    if (err.status === 1) return { status: `refused: ${String(err.stderr).trim().split("\n").pop().slice(0, 160)}`, seconds };
    return { status: err.signal ? `killed (${err.signal})` : `error ${err.status}`, seconds };
  }
}
