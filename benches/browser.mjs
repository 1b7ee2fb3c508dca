// Drop-to-result in the browser against the native CLI, measured in the same
// run on the same machine (issues 6 and 8).
//
//   trunk build --release && cargo build --release --bin memcast
//   node benches/browser.mjs [FILE...]      # default: the largest fixture
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
