// the browser tests' layout checks (tests/console/test_console.py), run in the page

// what a box (a panel, the header, a toolbar) holds that pokes out of it: every element whose
// box crosses the box's left or right edge, except inside a .scroll wrapper (a table's own
// scrolling box, itself checked); and the page itself scrolling sideways
window.layoutFaults = () => {
  const faults = [];
  const name = (el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}${typeof el.className === "string" && el.className ? "." + el.className.split(" ").join(".") : ""} "${(el.textContent || "").trim().slice(0, 30)}"`;
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > width + 1) faults.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${width} px window`);
  const boxes = document.querySelectorAll("header, footer, section.panel, main > div > .toolbar, main > div > .tabs, main > div > h1, main > div > .crumbs, main > div > .pager");
  for (const box of boxes) {
    const b = box.getBoundingClientRect();
    if (b.left < -1 || b.right > width + 1) faults.push(`${name(box)} at ${b.left}..${b.right}, outside the window (${width})`);
    for (const el of box.querySelectorAll("*")) {
      const scroller = el.parentElement.closest(".scroll");
      if (scroller && box.contains(scroller)) continue;
      const r = el.getBoundingClientRect();
      if (!r.width || !r.height) continue;
      if (r.left < b.left - 1 || r.right > b.right + 1) faults.push(`${name(el)} at ${Math.round(r.left)}..${Math.round(r.right)}, outside ${name(box)} at ${Math.round(b.left)}..${Math.round(b.right)}`);
    }
  }
  return faults;
};

// the columns of table #id that cannot be seen: each header cell, scrolled to in its .scroll
// box, must lie inside that box and show its whole text
window.hiddenColumns = (id) => {
  const table = document.getElementById(id);
  const box = table.closest(".scroll");
  if (!box) return ["the table has no scrolling box"];
  const hidden = [];
  for (const th of table.querySelectorAll("thead th")) {
    th.scrollIntoView({ block: "nearest", inline: "nearest" });
    const b = box.getBoundingClientRect(), r = th.getBoundingClientRect();
    const inside = r.left >= b.left - 1 && r.right <= b.right + 1 && r.left >= -1 && r.right <= document.documentElement.clientWidth + 1;
    if (!inside || th.scrollWidth > th.clientWidth + 1 || !r.width) hidden.push(th.textContent);
  }
  box.scrollLeft = 0;
  const wide = box.scrollWidth > box.clientWidth + 1;
  if (wide && !["auto", "scroll"].includes(getComputedStyle(box).overflowX)) hidden.push("(the box does not scroll)");
  return hidden;
};
