// The dashboard's own script: the security policy allows no inline script and no eval, so
// the confirmations before an action and the pause of refreshes in a hidden tab live here.

// An action's form asks first: data-confirm is the question, data-confirm-field a field whose
// value ends it ("Resolve send/3 as " + "processed" + "?").
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || form.dataset.confirm === undefined) return;
  const field = form.dataset.confirmField;
  const question = field ? form.dataset.confirm + form.elements[field].value + "?"
                         : form.dataset.confirm;
  if (!window.confirm(question)) event.preventDefault();
});

// A refreshing part of the page (data-poll) asks nothing while the tab is hidden.
document.addEventListener("htmx:beforeRequest", (event) => {
  if (event.detail.elt.hasAttribute("data-poll") && document.visibilityState !== "visible") {
    event.preventDefault();
  }
});

// "Back" on an error page goes back where the visitor came from, when there is somewhere.
document.addEventListener("click", (event) => {
  const back = event.target instanceof Element ? event.target.closest("a[data-back]") : null;
  if (back && window.history.length > 1) {
    event.preventDefault();
    window.history.back();
  }
});
