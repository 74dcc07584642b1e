// The deployment page's playground: send a chat message or a KServe v2 infer request through
// the gateway (via the portal, which forwards it with the caller key this tab holds).
(function () {
  "use strict";

  var panel = document.getElementById("playground");
  if (!panel) return;
  var keyInput = document.getElementById("pg-key");
  var meta = document.getElementById("pg-meta");
  var answer = document.getElementById("pg-answer");
  var sendButton = document.getElementById("pg-send");
  var mintButton = document.getElementById("pg-mint");
  var storageKey = "playground-key:" + panel.dataset.team;
  var mintedAt = 0;

  keyInput.value = sessionStorage.getItem(storageKey) || "";
  keyInput.addEventListener("change", function () {
    sessionStorage.setItem(storageKey, keyInput.value.trim());
  });

  function csrfToken() {
    try {
      return JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
    } catch (error) {
      return "";
    }
  }

  function post(url, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: body === undefined ? "{}" : JSON.stringify(body),
    }).then(function (response) {
      return response.json().then(
        function (data) { return { ok: response.ok, data: data }; },
        function () { return { ok: false, data: { error: "The portal answered " + response.status + "." } }; }
      );
    });
  }

  function show(text, isError) {
    meta.textContent = text;
    meta.classList.toggle("error", Boolean(isError));
  }

  if (mintButton) {
    mintButton.addEventListener("click", function () {
      mintButton.disabled = true;
      post(panel.dataset.keyUrl).then(function (result) {
        mintButton.disabled = false;
        if (!result.ok) return show(result.data.error, true);
        keyInput.value = result.data.key;
        sessionStorage.setItem(storageKey, result.data.key);
        mintedAt = Date.now();
        var until = new Date(result.data.expires_at).toLocaleTimeString();
        show("A key for this model until " + until + ", listed on the Caller keys page.");
      });
    });
  }

  function request() {
    var body = { key: keyInput.value.trim() };
    if (panel.dataset.kind === "chat") {
      body.message = document.getElementById("pg-message").value;
      body.max_tokens = document.getElementById("pg-max-tokens").value;
    } else {
      body.request = JSON.parse(document.getElementById("pg-request").value);
    }
    return body;
  }

  function render(result) {
    var reply = result.body;
    var text;
    if (panel.dataset.kind === "chat" && result.status === 200 && reply.choices) {
      text = reply.choices[0].message.content;
    } else {
      text = typeof reply === "string" ? reply : JSON.stringify(reply, null, 2);
    }
    answer.hidden = false;
    answer.textContent = text;
    answer.dataset.status = String(result.status);
    show("HTTP " + result.status + " in " + result.milliseconds + " ms", result.status >= 400);
  }

  function send(retried) {
    var body;
    try {
      body = request();
    } catch (error) {
      return show("The infer request is not valid JSON: " + error.message, true);
    }
    sendButton.disabled = true;
    show("Sending…");
    post(panel.dataset.sendUrl, body).then(function (result) {
      sendButton.disabled = false;
      if (!result.ok) return show(result.data.error, true);
      // A key made a moment ago may not have reached every gateway yet: try once more.
      if (result.data.status === 401 && !retried && Date.now() - mintedAt < 5000) {
        return setTimeout(function () { send(true); }, 1000);
      }
      render(result.data);
    }, function () {
      sendButton.disabled = false;
      show("The portal did not answer.", true);
    });
  }

  sendButton.addEventListener("click", function () { send(false); });
})();
