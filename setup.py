"""Package metadata comes from settings.ini (nbdev 2 layout); nothing here is project-specific."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
c = cfg["DEFAULT"]
licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
req = lambda key: c.get(key, "").split()
setuptools.setup(
    name=c["lib_name"], version=c["version"], description=c["description"],
    license=licenses[c["license"]][0], author=c["author"], author_email=c["author_email"],
    url=c["git_url"], keywords=c["keywords"].split(), python_requires=f">={c['min_python']}",
    packages=setuptools.find_packages(include=[c["lib_name"], f"{c['lib_name']}.*"]),
    include_package_data=True, package_data={c["lib_name"]: ["assets/*", "assets/**/*"]},
    install_requires=req("requirements"),
    extras_require={"gpu": req("gpu_requirements"), "dev": req("dev_requirements")},
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown", zip_safe=False,
    entry_points={"console_scripts": c["console_scripts"].split(), "nbdev": [f"{c['lib_path']}={c['lib_path']}._modidx:d"]},
)
