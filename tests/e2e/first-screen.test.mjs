// The first screen answers the question: after a drop, the target GPU's
// verdict (with its headroom or shortfall), the peak and the GPUs the job fits
// on are above the fold on a laptop (1280×800) and a phone (390×844), before
// the details; the GPU chooser is grouped. Screenshots of both sizes go to
// target/e2e/ for people to look at.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdir } from "node:fs/promises";
import path from "node:path";
import { serveDist, launchBrowser, fixture, cliRun, SHOTS } from "./harness.mjs";

let site;
let browser;

before(async () => {
  site = await serveDist();
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await site?.close();
});

/** Asserts that `selector` is wholly inside the first `height` pixels of the page. */
async function aboveTheFold(page, selector, height) {
  const box = await page.locator(selector).boundingBox();
  assert.ok(box, `${selector} is not shown`);
  assert.ok(box.y >= 0 && box.y + box.height <= height, `${selector} ends at ${box.y + box.height} px, below the fold at ${height} px`);
}

for (const [width, height] of [[1280, 800], [390, 844]]) {
  test(`after a drop, the verdict, the peak and the GPUs it fits on are above the fold at ${width}×${height}`, async () => {
    const page = await browser.newPage();
    const problems = [];
    page.on("pageerror", (err) => problems.push(String(err)));
    await page.setViewportSize({ width, height });
    await page.goto(site.url);
    await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
    const trace = fixture("resnet18_sgd_bs32_pos1.json.gz");
    await page.setInputFiles("#file-input", trace);
    await page.locator("#verdict").waitFor({ timeout: 60_000 });
    await page.evaluate(() => window.scrollTo(0, 0));
    for (const selector of ["#verdict", "#peak-total-bytes", "#fits-on"]) {
      await aboveTheFold(page, selector, height);
    }
    // The answer is the CLI's for the default target, and comes before the details.
    const gpus = ["a100-80gb", "t4", "l4", "rtx-4090", "a100-40gb", "h100-80gb"];
    const expected = JSON.parse(cliRun(["estimate", "--json", trace, ...gpus.flatMap((g) => ["--gpu", g])]));
    const target = expected.gpus[0];
    const verdict = await page.textContent("#verdict");
    assert.match(verdict, /a100-80gb/);
    assert.match(verdict, target.fits ? /fits/i : /does not fit/i);
    const fitsOn = await page.textContent("#fits-on");
    for (const gpu of expected.gpus.filter((g) => g.fits)) assert.match(fitsOn, new RegExp(gpu.preset));
    const order = await page.evaluate(() => {
      const top = (s) => document.querySelector(s).getBoundingClientRect().top;
      return { answer: top("#verdict"), timeline: top("#timeline-chart") };
    });
    assert.ok(order.answer < order.timeline, "the verdict comes before the details");
    await mkdir(SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS, `first-screen-${width}x${height}.png`) });
    assert.deepEqual(problems, [], "the page threw");
    await page.close();
  });
}

test("an out-of-memory target says how much more it needs, and the GPU chooser is grouped", async () => {
  const page = await browser.newPage();
  await page.goto(site.url);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const groups = await page.locator("#gpu-list fieldset legend").allTextContents();
  assert.deepEqual(groups.map((g) => g.trim().toLowerCase()), ["data centre", "workstation", "consumer"]);
  const presets = JSON.parse(cliRun(["presets", "--json"]));
  assert.equal(await page.locator("#gpu-list fieldset input[type=checkbox]").count(), presets.length);
  assert.equal(await page.locator("#target-gpu optgroup").count(), 3);
  // A custom capacity too small for the job, made the target.
  await page.click("#compare summary");
  await page.fill("#custom-gpu", "300MiB");
  await page.press("#custom-gpu", "Enter");
  await page.selectOption("#target-gpu", "300MiB");
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#verdict", { hasText: /does not fit/i }).waitFor({ timeout: 60_000 });
  assert.match(await page.textContent("#verdict"), /300MiB.*needs .* more/s);
  await page.screenshot({ path: path.join(SHOTS, "first-screen-oom.png") });
  await page.close();
});
