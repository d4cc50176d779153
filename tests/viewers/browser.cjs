// Opens pytrace's outputs in headless Chromium (Debian's, driven by
// playwright-core) as a user would, and prints as JSON what the page shows;
// tests/integration/viewers.rs judges it against the fixture's known split.
//
//   node browser.cjs flamegraph FILE.svg FUNCTION...
//     searches each FUNCTION with the SVG's own search() and reads the
//     "Matched: N%" text, then clicks FUNCTION's widest frame and reads
//     which frames the zoom left visible, then "Reset Zoom".
//   node browser.cjs speedscope FILE.json
//     serves the speedscope app (its npm package) and FILE over HTTP on a
//     loopback port, loads FILE by #profileURL, and reads the Sandwich
//     view's table (function name, total and self share).
//
// The packages come from $PYTRACE_VIEWERS (scripts/test-tools.sh).
'use strict';
const fs = require('fs');
const http = require('http');
const path = require('path');

const viewers = process.env.PYTRACE_VIEWERS || '/var/cache/pytrace/viewers';
const { chromium } = require(path.join(viewers, 'node/node_modules/playwright-core'));
const speedscopeApp = path.join(viewers, 'node/node_modules/speedscope/dist/release');
const chromiumBinary = process.env.PYTRACE_CHROMIUM || '/usr/bin/chromium';

async function withPage(run) {
  // --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
  const browser = await chromium.launch({ executablePath: chromiumBinary, headless: true, args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    const errors = [];
    page.on('pageerror', e => errors.push(String(e)));
    const result = await run(page);
    result.page_errors = errors;
    return result;
  } finally {
    await browser.close();
  }
}

async function flamegraph(file, functions) {
  return withPage(async page => {
    await page.goto('file://' + path.resolve(file));
    const title = await page.textContent('#title');
    const searches = {};
    for (const name of functions) {
      // The frame's function is its title up to " (file)"; the button's own
      // prompt() would need a dialog, so call what it calls.
      searches[name] = await page.evaluate(n => {
        search('^' + n.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') + ' ');
        const text = document.getElementById('matched').textContent;
        search_prompt(); // a second press resets the search
        return text;
      }, name);
    }
    // Zoom: click the widest frame of the first function, as a user would.
    const target = functions[0];
    const frames = page.locator('#frames > g').filter({ has: page.locator('title', { hasText: new RegExp('^' + target + ' ') }) });
    let widest = null, widestWidth = -1;
    for (const g of await frames.all()) {
      const w = Number(await g.locator('rect').getAttribute('fg:w'));
      if (w > widestWidth) { widest = g; widestWidth = w; }
    }
    if (!widest) return { title, searches, zoom: null };
    // The frame's group, not its rect: a long label (a full path) covers
    // the rect's middle, and a user's click there lands on the label, in
    // the same group, whose handler zooms.
    await widest.click();
    const zoom = await page.evaluate(() => {
      const shown = [];
      for (const g of document.querySelectorAll('#frames > g')) {
        if (g.classList.contains('hide')) continue;
        const rect = g.querySelector('rect');
        shown.push({ title: g.querySelector('title').textContent, width: parseFloat(rect.getAttribute('width')), parent: g.classList.contains('parent'), label: g.querySelector('text').textContent });
      }
      return { unzoom_shown: !document.getElementById('unzoom').classList.contains('hide'), shown };
    });
    await page.click('#unzoom');
    zoom.hidden_after_reset = await page.evaluate(() => document.querySelectorAll('#frames > g.hide').length);
    return { title, searches, zoom };
  });
}

async function speedscope(file) {
  const server = http.createServer((req, res) => {
    const url = decodeURIComponent(req.url.split(/[?#]/)[0]);
    const local = url === '/profile.json' ? path.resolve(file) : path.join(speedscopeApp, path.normalize(url === '/' ? '/index.html' : url));
    if (!local.startsWith(speedscopeApp) && local !== path.resolve(file)) { res.writeHead(403); res.end(); return; }
    fs.readFile(local, (err, data) => {
      if (err) { res.writeHead(404); res.end(); return; }
      const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json', '.wasm': 'application/wasm' };
      res.writeHead(200, { 'content-type': types[path.extname(local)] || 'application/octet-stream' });
      res.end(data);
    });
  });
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  try {
    return await withPage(async page => {
      await page.goto(`${base}/index.html#profileURL=${encodeURIComponent(base + '/profile.json')}`);
      // The view tabs appear once the profile has loaded.
      // (each tab's label starts with an emoji)
      await page.getByText(/Sandwich$/).click({ timeout: 30000 });
      await page.waitForSelector('tr:has(td)', { timeout: 30000 });
      // Sorted by total share, the known functions come first: the table
      // renders only the rows in view.
      await page.getByText('Total', { exact: true }).click();
      const rows = await page.evaluate(() => [...document.querySelectorAll('tr:has(td)')].map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent.trim())));
      const title = await page.title();
      return { title, rows };
    });
  } finally {
    server.close();
  }
}

(async () => {
  const [mode, file, ...rest] = process.argv.slice(2);
  const result = mode === 'flamegraph' ? await flamegraph(file, rest) : mode === 'speedscope' ? await speedscope(file) : null;
  if (!result) throw new Error(`unknown mode ${mode}: flamegraph or speedscope`);
  process.stdout.write(JSON.stringify(result) + '\n');
})().catch(e => { console.error(e); process.exit(1); });
